use std::path::PathBuf;

/// Why a build (or a build API call) failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("build {0} not found")]
    NotFound(String),
    #[error("build {0} already exists")]
    AlreadyExists(String),
    #[error("invalid build id {0:?}: use 1-64 of [A-Za-z0-9_-]")]
    InvalidBuildId(String),
    #[error("invalid files hash {0:?}: the SDK sends 64 lowercase hex digits")]
    InvalidFilesHash(String),
    #[error("invalid upload scope {0:?}")]
    InvalidScope(String),
    #[error(
        "upload for files hash {hash} is not a tar or tar.gz archive ({detail}); upload it again"
    )]
    BadUpload { hash: String, detail: String },
    #[error("step {step}: {message}")]
    Step { step: String, message: String },
    #[error("step {step} failed ({status}): {stderr}")]
    CommandFailed {
        step: String,
        status: String,
        stderr: String,
    },
    #[error("base image: {0}")]
    Pull(#[from] berth_oci::OciError),
    #[error("template store: {0}")]
    Template(#[from] berth_template::TemplateError),
    #[error("build sandbox: {0}")]
    Runtime(#[from] berth_runtime::RuntimeError),
    #[error("build sandbox network: {0}")]
    Network(Box<dyn std::error::Error + Send + Sync>),
    #[error("the template is not ready after {seconds} s of its ready command {ready_cmd:?}; last output: {output}")]
    ReadyTimeout {
        seconds: u64,
        ready_cmd: String,
        output: String,
    },
    #[error("build cancelled")]
    Cancelled,
    #[error("build interrupted: berth stopped while it ran")]
    Interrupted,
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Dockerfile line {line}: {message}")]
    Dockerfile { line: usize, message: String },
}

impl BuildError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BuildError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn step(step: &str, message: impl Into<String>) -> Self {
        BuildError::Step {
            step: step.to_string(),
            message: message.into(),
        }
    }

    /// True when the host ran out of room (disk, sandbox slots): the request was fine
    /// and can succeed later.
    pub fn is_capacity(&self) -> bool {
        match self {
            BuildError::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ),
            BuildError::Runtime(source) => source.is_capacity(),
            _ => false,
        }
    }

    /// The step the failure belongs to (E2B's `reason.step`: "base", "1".., "finalize").
    pub fn step_name(&self) -> Option<&str> {
        match self {
            BuildError::Step { step, .. } | BuildError::CommandFailed { step, .. } => Some(step),
            BuildError::Pull(_) => Some("base"),
            BuildError::ReadyTimeout { .. } => Some("finalize"),
            _ => None,
        }
    }
}
