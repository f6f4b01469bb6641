use std::path::PathBuf;

/// Why a template operation failed.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template {0:?} not found")]
    NotFound(String),
    #[error(
        "invalid template id {0:?}: use 1-128 of [A-Za-z0-9._-], not starting with '.' or '-'"
    )]
    InvalidId(String),
    #[error("template {template:?} refers to layer {layer} which is not in the store")]
    MissingLayer { template: String, layer: String },
    #[error("{tool} is not installed or not in PATH; install it (Debian/Ubuntu: `apt-get install {package}`)")]
    ToolMissing {
        tool: &'static str,
        package: &'static str,
    },
    #[error("building templates needs root (debootstrap and chroot); run berth as root")]
    NotRoot,
    #[error("network failure while {stage}: could not reach {mirror}; check connectivity or set another mirror ({detail})")]
    Network {
        stage: String,
        mirror: String,
        detail: String,
    },
    #[error("{stage} failed ({status}); last output:\n{output_tail}")]
    BuildFailed {
        stage: String,
        status: String,
        output_tail: String,
    },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("manifest {path} is not valid: {source}")]
    BadManifest {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{what}: {detail}")]
    Transfer { what: String, detail: String },
    #[error("{path} arrived different from what was sent (tree hash {found}, sender's {expected}); it was not used")]
    TreeMismatch {
        path: PathBuf,
        expected: String,
        found: String,
    },
}

impl TemplateError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        TemplateError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Attach the operation and path to an I/O error.
pub(crate) trait IoContext<T> {
    fn ctx(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T, TemplateError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, op: &'static str, path: impl Into<PathBuf>) -> Result<T, TemplateError> {
        self.map_err(|source| TemplateError::io(op, path, source))
    }
}
