//! The control plane's one error boundary.
//!
//! Services (the sandbox pipeline, snapshots, templates, the store) return
//! [`ServiceError`], one variant per cause, and never build HTTP answers. Exactly one
//! function, [`to_api`] (reached through `From<ServiceError> for ApiError`), turns a
//! service error into E2B's `{code, message}` shape and status, and logs every 5xx with
//! its cause chain and the sandbox it concerns. Handlers validate their own input and
//! answer those mistakes with `ApiError::BadRequest` directly; everything else reaches
//! the client through `?`.
//!
//! The proxy answers with its own shapes (`berth_proxy::ProxyError`, documented there):
//! E2B's clients expect a 502 `{sandboxId, message, code}` for a sandbox they cannot
//! reach, which is not the API's shape.

use berth_api::ApiError;
use berth_runtime::RuntimeError;
use berth_store::StoreError;
use berth_template::TemplateError;

use crate::envd::EnvdError;
use crate::webhook_target::WebhookTargetError;

/// A step of a sandbox's bring-up or teardown, named in errors and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Create,
    Resume,
    Restore,
    Pause,
    Checkpoint,
    UpdateNetwork,
    Kill,
    DeleteCheckpoint,
    Recover,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Create => "starting the sandbox",
            Stage::Resume => "resuming the sandbox",
            Stage::Restore => "starting the sandbox from a checkpoint",
            Stage::Pause => "pausing the sandbox",
            Stage::Checkpoint => "checkpointing the sandbox",
            Stage::UpdateNetwork => "updating the sandbox's network policy",
            Stage::Kill => "killing the sandbox",
            Stage::DeleteCheckpoint => "deleting a checkpoint",
            Stage::Recover => "recovering sandboxes",
        })
    }
}

/// Everything a control-plane service can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// No node can take the sandbox (split deployment).
    #[error("sandbox_capacity_unavailable: {0}")]
    NoNodeFits(#[source] berth_cluster::PlacementError),
    #[error("node {0} is not registered")]
    NodeUnknown(String),
    #[error("node {node} is registered with an unusable URL: {source}")]
    NodeUrl {
        node: String,
        #[source]
        source: berth_cluster::NodeAddrError,
    },
    #[error("node {node} is unreachable; retry shortly (its sandboxes are reported lost if its lease lapses)")]
    NodeUnreachable {
        node: String,
        #[source]
        source: berth_cluster::ForwardError,
    },
    #[error("fetching {what} from node {node}: {detail}")]
    NodeFetch {
        node: String,
        what: String,
        detail: String,
    },
    /// A sandbox's volumes live on different nodes, so no node can mount them all.
    #[error("volumes {0} live on different nodes; a sandbox can mount volumes of one node only")]
    VolumesOnSeveralNodes(String),
    /// Also the answer for another team's sandbox: the two are indistinguishable.
    #[error("sandbox \"{0}\" doesn't exist or you don't have access to it")]
    SandboxNotFound(String),
    #[error("sandbox {0} is already paused")]
    AlreadyPaused(String),
    #[error("sandbox {0} is paused; resume it first")]
    Paused(String),
    #[error("sandbox {0} is already running")]
    AlreadyRunning(String),
    #[error("template \"{0}\" not found")]
    TemplateNotFound(String),
    #[error("invalid template id \"{name}\": {source}")]
    InvalidTemplate {
        name: String,
        #[source]
        source: TemplateError,
    },
    #[error("template \"{name}\" is incomplete on this host: {source}")]
    TemplateIncomplete {
        name: String,
        #[source]
        source: TemplateError,
    },
    #[error("loading template \"{name}\": {source}")]
    Template {
        name: String,
        #[source]
        source: TemplateError,
    },
    #[error("listing templates: {0}")]
    TemplateListing(#[source] TemplateError),
    #[error("\"{0}\" is the name of a template; choose another snapshot name")]
    SnapshotNameTaken(String),
    /// The snapshot's trial restore failed; the snapshot was deleted, not reported made.
    #[error("the snapshot was taken but does not restore, so it was discarded: {0}")]
    SnapshotUnrestorable(#[source] Box<ServiceError>),
    /// E2B's words for its concurrency limit, with the operator in place of sales.
    #[error(
        "You have reached the maximum number of concurrent E2B sandboxes ({limit}). If you \
         need more, kill or pause some, or ask the operator of this berth to raise \
         --team-max-sandboxes (team_quotas.max_sandboxes in its config file)."
    )]
    TeamSandboxLimit { limit: u64 },
    /// Another per-team quota (`crate::limits`).
    #[error(
        "Your team has reached its limit of {limit} {} ({used} in use, this needs {asked} \
         more). Kill, pause or delete what you no longer need ({}), or ask the operator of \
         this berth to raise {}.",
        resource.counted(), resource.remedy(), resource.setting()
    )]
    TeamQuota {
        resource: crate::limits::QuotaResource,
        limit: u64,
        used: u64,
        asked: u64,
    },
    #[error(
        "snapshot \"{0}\" mounts its own volumes (those of the sandbox it was taken from); \
         leave volumeMounts out or repeat them exactly"
    )]
    SnapshotVolumeMounts(String),
    #[error("{stage} {sandbox}: {source}")]
    Runtime {
        sandbox: String,
        stage: Stage,
        #[source]
        source: RuntimeError,
    },
    #[error("sandbox {sandbox}: envd did not come up ({stage}): {source}")]
    Envd {
        sandbox: String,
        stage: Stage,
        #[source]
        source: EnvdError,
    },
    #[error("invalid network policy: {0}")]
    InvalidNetwork(#[from] berth_net::PolicyError),
    #[error(transparent)]
    WebhookTarget(#[from] WebhookTargetError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("volume {volume}: {source}")]
    Volume {
        volume: String,
        #[source]
        source: RuntimeError,
    },
    #[error(
        "volume {volume} is mounted by sandbox(es) {}; kill them first",
        sandboxes.join(", ")
    )]
    VolumeInUse {
        volume: String,
        sandboxes: Vec<String>,
    },
    #[error("{0}")]
    Secret(#[from] crate::secrets::SecretError),
    #[error("{what}: a worker task failed: {source}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    #[error(transparent)]
    InvalidName(#[from] crate::templates::NameError),
    #[error(
        "template \"{0}\" is not yours to change (it is installed on this host or another team's)"
    )]
    TemplateNotOwned(String),
    #[error("template \"{template}\" has no ready build tagged \"{tag}\" (its first build may still be running)")]
    TagNotFound { template: String, tag: String },
    #[error("build \"{build}\" of template \"{template}\" not found")]
    BuildNotFound { template: String, build: String },
    #[error(
        "build {0} is not waiting to start: it was started already, or a newer build superseded it"
    )]
    BuildNotWaiting(String),
    #[error("cannot delete template \"{template}\": {sandboxes} running or paused sandbox(es) and {snapshots} snapshot(s) use it; kill them (and delete the snapshots) first")]
    TemplateInUse {
        template: String,
        sandboxes: u64,
        snapshots: u64,
    },
    #[error("{what} must be between {min} and {max} on this host, got {value}")]
    ResourceOutOfRange {
        what: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
    #[error("building templates (it needs berth up's Linux runtime)")]
    BuildsUnavailable,
    #[error("template build: {0}")]
    Build(#[source] berth_build::BuildError),
    #[error("building template \"{name}\" on this host failed: {reason}; its build log is in berth's log (RUST_LOG=info), and `berth provision --template {name}` retries it with the log on the terminal")]
    HostTemplateBuild { name: String, reason: String },
    #[error("reading the files of host template \"{name}\": {source}")]
    HostTemplateContext {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("upload refused: {0}")]
    UploadDenied(&'static str),
    #[error("uploads are limited to {limit} bytes")]
    UploadTooLarge { limit: u64 },
    #[error("template \"{0}\" starts from its start command's checkpoint, where volumes cannot be mounted; create without volumeMounts, or build the template without a start command")]
    StartCommandVolumes(String),
}

impl ServiceError {
    /// The sandbox this error concerns, for the log line of a 5xx.
    fn sandbox(&self) -> Option<&str> {
        match self {
            ServiceError::SandboxNotFound(id)
            | ServiceError::AlreadyPaused(id)
            | ServiceError::Paused(id)
            | ServiceError::AlreadyRunning(id)
            | ServiceError::Runtime { sandbox: id, .. }
            | ServiceError::Envd { sandbox: id, .. } => Some(id),
            _ => None,
        }
    }
}

/// The HTTP answer for a runtime failure during `stage` of `sandbox`.
fn runtime_to_api(err: &ServiceError, source: &RuntimeError) -> ApiError {
    match source {
        RuntimeError::NotFound(id) => ApiError::sandbox_not_found(id),
        RuntimeError::NotPaused(id) => ApiError::Conflict(format!("sandbox {id} is running")),
        RuntimeError::CheckpointNotFound(id) => {
            ApiError::NotFound(format!("checkpoint {id} not found"))
        }
        RuntimeError::InvalidId(_) | RuntimeError::InvalidCheckpointId(_) => {
            ApiError::BadRequest(err.to_string())
        }
        RuntimeError::Network(berth_net::NetError::Policy(_)) => {
            ApiError::BadRequest(source.to_string())
        }
        RuntimeError::Network(berth_net::NetError::Disabled) => ApiError::NotImplemented(
            "network policies without sandbox networking (--sandbox-cidr)".into(),
        ),
        RuntimeError::Unsupported { backend, what } => {
            ApiError::NotImplemented(format!("{what} on berth's {backend} runtime"))
        }
        RuntimeError::VolumeNotFound(_) => ApiError::NotFound(err.to_string()),
        RuntimeError::InvalidMountPath { .. } | RuntimeError::InvalidVolumeId(_) => {
            ApiError::BadRequest(err.to_string())
        }
        RuntimeError::VolumeExists(_) | RuntimeError::Unrestorable { .. } => {
            ApiError::Conflict(err.to_string())
        }
        RuntimeError::NoFreeSlot { .. } | RuntimeError::CriuUnavailable(_) => {
            ApiError::Unavailable(err.to_string())
        }
        other if other.is_capacity() => ApiError::Unavailable(format!(
            "{err} (the host is out of capacity; try again later)"
        )),
        _ => ApiError::Internal(err.to_string()),
    }
}

/// The HTTP answer for a build engine refusal.
fn build_to_api(err: &ServiceError, source: &berth_build::BuildError) -> ApiError {
    use berth_build::BuildError;
    match source {
        BuildError::NotFound(_) => ApiError::NotFound(err.to_string()),
        BuildError::AlreadyExists(_) => ApiError::Conflict(err.to_string()),
        BuildError::InvalidBuildId(_)
        | BuildError::InvalidFilesHash(_)
        | BuildError::InvalidScope(_)
        | BuildError::BadUpload { .. } => ApiError::BadRequest(err.to_string()),
        BuildError::Template(berth_template::TemplateError::InvalidId(_)) => {
            ApiError::BadRequest(err.to_string())
        }
        other if other.is_capacity() => ApiError::Unavailable(format!(
            "{err} (the host is out of space; free some and retry)"
        )),
        _ => ApiError::Internal(err.to_string()),
    }
}

/// The one mapping from a service error to the status and `{code, message}` a client
/// sees. Every 5xx is logged here with its cause chain.
pub fn to_api(err: &ServiceError) -> ApiError {
    let api = match err {
        ServiceError::SandboxNotFound(id) => ApiError::sandbox_not_found(id),
        ServiceError::AlreadyPaused(_)
        | ServiceError::Paused(_)
        | ServiceError::AlreadyRunning(_)
        | ServiceError::SnapshotNameTaken(_) => ApiError::Conflict(err.to_string()),
        ServiceError::TemplateNotFound(_) => ApiError::NotFound(err.to_string()),
        // A full host is 503 (the trial needs a slot); any other failure is berth's.
        ServiceError::SnapshotUnrestorable(cause) => match cause.as_ref() {
            ServiceError::Runtime { source, .. } if source.is_capacity() => {
                ApiError::Unavailable(err.to_string())
            }
            ServiceError::Runtime {
                source: RuntimeError::NoFreeSlot { .. },
                ..
            } => ApiError::Unavailable(err.to_string()),
            _ => ApiError::Internal(err.to_string()),
        },
        ServiceError::TeamSandboxLimit { .. } | ServiceError::TeamQuota { .. } => {
            ApiError::TooManyRequests(err.to_string())
        }
        ServiceError::InvalidTemplate { .. } | ServiceError::SnapshotVolumeMounts(_) => {
            ApiError::BadRequest(err.to_string())
        }
        ServiceError::InvalidNetwork(policy) => ApiError::BadRequest(policy.to_string()),
        ServiceError::TemplateIncomplete { .. } | ServiceError::Envd { .. } => {
            ApiError::Unavailable(err.to_string())
        }
        ServiceError::Runtime { source, .. } | ServiceError::Volume { source, .. } => {
            runtime_to_api(err, source)
        }
        ServiceError::VolumeInUse { .. } => ApiError::Conflict(err.to_string()),
        ServiceError::Secret(secret) => secret.to_api(),
        ServiceError::WebhookTarget(target) if target.is_bad_url() => {
            ApiError::BadRequest(err.to_string())
        }
        ServiceError::WebhookTarget(_) => ApiError::Internal(err.to_string()),
        ServiceError::Store(store) => match store {
            StoreError::NotFound { .. } => ApiError::NotFound(store.to_string()),
            StoreError::TeamExists { .. }
            | StoreError::NameTaken { .. }
            | StoreError::InUse { .. } => ApiError::Conflict(store.to_string()),
            StoreError::InvalidCursor { .. } => ApiError::BadRequest(store.to_string()),
            // Locked, unreachable, out of connections, or conflicting: retry later.
            store if store.is_unavailable() => ApiError::Unavailable(store.to_string()),
            _ => ApiError::Internal(store.to_string()),
        },
        ServiceError::HostTemplateBuild { .. } => ApiError::Unavailable(err.to_string()),
        ServiceError::Template { .. }
        | ServiceError::HostTemplateContext { .. }
        | ServiceError::TemplateListing(_)
        | ServiceError::Task { .. } => ApiError::Internal(err.to_string()),
        ServiceError::InvalidName(_)
        | ServiceError::BuildNotWaiting(_)
        | ServiceError::TemplateInUse { .. }
        | ServiceError::ResourceOutOfRange { .. }
        | ServiceError::StartCommandVolumes(_) => ApiError::BadRequest(err.to_string()),
        ServiceError::TemplateNotOwned(_) | ServiceError::UploadDenied(_) => {
            ApiError::Forbidden(err.to_string())
        }
        ServiceError::TagNotFound { .. } | ServiceError::BuildNotFound { .. } => {
            ApiError::NotFound(err.to_string())
        }
        ServiceError::BuildsUnavailable => ApiError::NotImplemented(err.to_string()),
        ServiceError::UploadTooLarge { limit } => ApiError::PayloadTooLarge {
            limit: usize::try_from(*limit).unwrap_or(usize::MAX),
        },
        ServiceError::Build(build) => build_to_api(err, build),
        ServiceError::NoNodeFits(_)
        | ServiceError::NodeUnreachable { .. }
        | ServiceError::NodeFetch { .. } => ApiError::Unavailable(err.to_string()),
        ServiceError::NodeUnknown(_) | ServiceError::NodeUrl { .. } => {
            ApiError::Internal(err.to_string())
        }
        ServiceError::VolumesOnSeveralNodes(_) => ApiError::BadRequest(err.to_string()),
    };
    if api.status() >= 500 {
        let chain = error_chain(err);
        match err.sandbox() {
            Some(sandbox) => tracing::error!(%sandbox, status = api.status(), error = %chain),
            None => tracing::error!(status = api.status(), error = %chain),
        }
    }
    api
}

/// `err` and each of its sources, joined with ": ", skipping a source whose text the
/// outer message already contains.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

impl From<ServiceError> for ApiError {
    fn from(err: ServiceError) -> Self {
        to_api(&err)
    }
}

/// What a handler fails with: an E2B error answer. Handlers build [`ApiError`]s for
/// their own input checks; service and store errors become one through [`to_api`].
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct HttpError(pub ApiError);

impl From<ApiError> for HttpError {
    fn from(err: ApiError) -> Self {
        HttpError(err)
    }
}

impl From<ServiceError> for HttpError {
    fn from(err: ServiceError) -> Self {
        HttpError(to_api(&err))
    }
}

impl From<StoreError> for HttpError {
    fn from(err: StoreError) -> Self {
        HttpError(to_api(&ServiceError::Store(err)))
    }
}

impl axum::response::IntoResponse for HttpError {
    fn into_response(self) -> axum::response::Response {
        self.0.into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(source: RuntimeError) -> ServiceError {
        ServiceError::Runtime {
            sandbox: "isbx".into(),
            stage: Stage::Create,
            source,
        }
    }

    #[test]
    fn capacity_is_a_503_that_says_so() {
        let api = to_api(&runtime(RuntimeError::NoFreeSlot { max: 3 }));
        assert_eq!(api.status(), 503);
        assert!(
            api.to_string().contains("all 3 sandbox slots are in use"),
            "{api}"
        );
        let full = RuntimeError::Io {
            op: "create sandbox disk".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        let api = to_api(&runtime(full));
        assert_eq!(api.status(), 503);
        assert!(api.to_string().contains("out of capacity"), "{api}");
    }

    #[test]
    fn state_errors_are_conflicts_and_missing_sandboxes_404() {
        assert_eq!(
            to_api(&ServiceError::AlreadyPaused("i1".into())).status(),
            409
        );
        assert_eq!(to_api(&ServiceError::Paused("i1".into())).status(), 409);
        assert_eq!(
            to_api(&runtime(RuntimeError::NotFound("i1".into()))).status(),
            404
        );
        assert_eq!(
            to_api(&ServiceError::Store(StoreError::NotFound {
                what: "snapshot",
                id: "x".into()
            }))
            .status(),
            404
        );
    }

    #[test]
    fn the_cause_chain_is_kept_without_repeats() {
        let err = runtime(RuntimeError::Io {
            op: "write record".into(),
            source: std::io::Error::other("disk on fire"),
        });
        let chain = error_chain(&err);
        assert_eq!(chain.matches("disk on fire").count(), 1, "{chain}");
        assert!(chain.starts_with("starting the sandbox isbx"), "{chain}");
    }
}
