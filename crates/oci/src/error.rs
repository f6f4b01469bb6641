use std::path::PathBuf;

use berth_template::TemplateError;

/// Why pulling an image failed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference {
        reference: String,
        reason: &'static str,
    },
    #[error("registry credentials of type {kind:?} need that cloud's API, which berth does not call; push the image to a registry that takes a username and password (type \"registry\") or use a mirror")]
    UnsupportedCredentials { kind: String },
    #[error("could not reach registry {registry}: {source}; check the address, that it serves the Registry v2 API, and the operator's mirror setting")]
    Connect {
        registry: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("registry {registry} refused access to {repository} ({status}); pass registry credentials (fromImageRegistry) or check them")]
    Unauthorized {
        registry: String,
        repository: String,
        status: u16,
    },
    #[error("the token service of registry {registry} at {realm} failed: {detail}")]
    Token {
        registry: String,
        realm: String,
        detail: String,
    },
    #[error("{what} not found in registry {registry} (repository {repository})")]
    NotFound {
        registry: String,
        repository: String,
        what: String,
    },
    #[error("registry {registry} answered {status} for {url}")]
    Status {
        registry: String,
        url: String,
        status: u16,
    },
    #[error("registry {registry} sent a malformed {what}: {detail}")]
    Malformed {
        registry: String,
        what: &'static str,
        detail: String,
    },
    #[error("unsupported {what} media type {media_type:?}")]
    UnsupportedMediaType {
        what: &'static str,
        media_type: String,
    },
    #[error("image {reference} has no {platform} variant (it has: {available})")]
    NoMatchingPlatform {
        reference: String,
        platform: String,
        available: String,
    },
    #[error("{what} {expected}: the bytes received hash to {actual}; the registry or a proxy corrupted it, try again")]
    DigestMismatch {
        what: &'static str,
        expected: String,
        actual: String,
    },
    #[error("layer {digest} is not a valid tar archive: {detail}")]
    BadArchive { digest: String, detail: String },
    #[error("layer {digest} has an entry {path:?} outside the layer root (absolute or '..' path); the image is malformed or hostile")]
    PathTraversal { digest: String, path: String },
    #[error(
        "layer {digest}: {path:?} is owned by {id}, outside 0..65535, which sandboxes cannot map"
    )]
    UnmappableOwner {
        digest: String,
        path: String,
        id: u64,
    },
    #[error("layer {digest}: hard link {path:?} points at {target:?}, which is not a file of the same layer")]
    BadHardLink {
        digest: String,
        path: String,
        target: String,
    },
    #[error("layer {digest} is a foreign layer (only at {urls:?}); berth only pulls layers the registry serves")]
    ForeignLayer { digest: String, urls: Vec<String> },
    #[error("image has {layers} layers but its config lists {diff_ids} diff ids")]
    LayerCountMismatch { layers: usize, diff_ids: usize },
    #[error("pull cancelled")]
    Cancelled,
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] TemplateError),
}

impl OciError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        OciError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
