//! envd's plain HTTP routes besides `/health`: `/files` (download and upload),
//! `/files/compose`, `/init`, `/envs` and `/metrics`, per E2B's `envd.yaml`.
//!
//! Mount [`router`] on the envd app; it expects `auth::require_access_token` around it
//! (the `/files` routes do their own token-or-signature check). Every error answers JSON
//! `{"code": <status>, "message": "..."}` naming the offending field or path.
//!
//! File bodies are streamed both ways: downloads are read by a blocking thread in
//! 256 KiB chunks, uploads are written chunk by chunk as they arrive (see [`upload`]), so
//! neither ever holds a whole file in memory.

pub mod compose;
pub mod download;
pub mod init;
pub mod metadata;
pub mod metrics;
pub mod upload;

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

use berth_envd_proto::headers::ACCESS_TOKEN;
pub use berth_envd_proto::http::EntryInfo as HttpEntryInfo;

use crate::auth::{check_file_access, unix_now, FileCredentials, FileOperation};
use crate::state::{Defaults, EnvdState};
use crate::users::{basic_auth_username, User, UserError};

/// The HTTP routes this module serves.
pub fn router() -> Router<Arc<EnvdState>> {
    Router::new()
        .route("/files", get(download::get_file).post(upload::post_files))
        .route("/files/compose", post(compose::post_compose))
        .route("/init", post(init::post_init))
        .route("/envs", get(init::get_envs))
        .route("/metrics", get(metrics::get_metrics))
}

/// An error answered as `{"code","message"}` with `status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HttpError {
    pub status: StatusCode,
    pub message: String,
}

impl HttpError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// An I/O failure while doing `action` (e.g. "error opening file") on `path`:
    /// a full disk or quota answers 507, a missing path 404, a path the user may not
    /// write or on a read-only filesystem 403, anything else 500.
    pub fn io(action: &str, path: &Path, err: &io::Error) -> Self {
        if is_disk_full(err) {
            return Self::new(
                StatusCode::INSUFFICIENT_STORAGE,
                format!(
                    "not enough disk space available: {action} '{}': {err}",
                    path.display()
                ),
            );
        }
        if err.kind() == io::ErrorKind::NotFound {
            return Self::new(
                StatusCode::NOT_FOUND,
                format!("path '{}' does not exist", path.display()),
            );
        }
        if matches!(
            err.raw_os_error(),
            Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS)
        ) {
            return Self::new(
                StatusCode::FORBIDDEN,
                format!("{action} '{}': {err}", path.display()),
            );
        }
        Self::internal(format!("{action} '{}': {err}", path.display()))
    }
}

/// ENOSPC or EDQUOT: the sandbox's disk or quota is full.
pub fn is_disk_full(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        (
            self.status,
            axum::Json(serde_json::json!({
                "code": self.status.as_u16(),
                "message": self.message,
            })),
        )
            .into_response()
    }
}

impl From<UserError> for HttpError {
    fn from(err: UserError) -> Self {
        match err {
            UserError::UnknownUser(_) | UserError::InvalidAuthorization(_) => {
                Self::new(StatusCode::UNAUTHORIZED, err.to_string())
            }
            UserError::Read { .. } => Self::internal(err.to_string()),
        }
    }
}

/// The query parameters of `GET /files` and `POST /files`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FilesQuery {
    pub path: Option<String>,
    pub username: Option<String>,
    pub signature: Option<String>,
    /// Unix seconds; kept as text so a malformed value gets our own 400.
    pub signature_expiration: Option<String>,
}

/// The `/files` access check: the access token, or a signature for `operation`.
pub fn authorize(
    state: &EnvdState,
    query: &FilesQuery,
    headers: &HeaderMap,
    operation: FileOperation,
) -> Result<(), HttpError> {
    let signature_expiration = match query.signature_expiration.as_deref() {
        None | Some("") => None,
        Some(text) => Some(text.parse::<i64>().map_err(|_| {
            HttpError::bad_request(format!(
                "invalid signature_expiration '{text}': expected unix seconds"
            ))
        })?),
    };
    let credentials = FileCredentials {
        header_token: headers.get(ACCESS_TOKEN).and_then(|v| v.to_str().ok()),
        signature: query.signature.as_deref(),
        signature_expiration,
        username: query.username.as_deref(),
        path: query.path.as_deref().unwrap_or(""),
    };
    let access_token = defaults(state).access_token;
    check_file_access(access_token.as_deref(), operation, &credentials, unix_now())
        .map_err(|e| HttpError::new(StatusCode::UNAUTHORIZED, e.to_string()))
}

/// The user a `/files` request acts as: the `username` parameter, else the user named by
/// `Authorization: Basic`, else the default user set at `/init`, else envd's own user.
pub fn request_user(
    state: &EnvdState,
    username: Option<&str>,
    headers: &HeaderMap,
) -> Result<User, HttpError> {
    let from_header = match headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        Some(value) => basic_auth_username(value)?,
        None => None,
    };
    let explicit = username
        .filter(|u| !u.is_empty())
        .or(from_header.as_deref());
    let default_user = defaults(state).user;
    Ok(state.users.resolve(explicit, default_user.as_deref())?)
}

/// A copy of the `/init` defaults (the lock is never held across an await).
pub fn defaults(state: &EnvdState) -> Defaults {
    state
        .defaults
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// Runs blocking file work off the async runtime, turning a panic into a 500.
pub async fn blocking<T, F>(work: F) -> Result<T, HttpError>
where
    F: FnOnce() -> Result<T, HttpError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| HttpError::internal(format!("file task failed: {e}")))?
}

/// Creates the missing ancestors of `dir` (and `dir` itself) with mode 0755, owned by
/// `user` when envd runs as root. An existing non-directory on the way is a 400.
pub fn ensure_dirs(dir: &Path, user: &User) -> Result<(), HttpError> {
    let mut missing = Vec::new();
    let mut cursor = Some(dir);
    while let Some(current) = cursor {
        match std::fs::metadata(current) {
            Ok(meta) if meta.is_dir() => break,
            Ok(_) => {
                return Err(HttpError::bad_request(format!(
                    "path '{}' is not a directory",
                    current.display()
                )))
            }
            // ENOTDIR: an ancestor is a file; walking up reports which one.
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                missing.push(current);
                cursor = current.parent();
            }
            Err(e) => return Err(HttpError::io("error checking directory", current, &e)),
        }
    }
    for created in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(0o755).create(created) {
            Ok(()) => chown_to(created, user)?,
            // Raced with another creator: fine as long as it is a directory now.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && created.is_dir() => {}
            Err(e) => return Err(HttpError::io("error creating directory", created, &e)),
        }
    }
    Ok(())
}

/// Gives `path` to `user` when envd runs as root; a non-root envd can only create files
/// as itself, so there is nothing to change.
pub fn chown_to(path: &Path, user: &User) -> Result<(), HttpError> {
    if !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, Some(user.uid), Some(user.gid))
        .map_err(|e| HttpError::io("error changing ownership of", path, &e))
}

#[cfg(test)]
pub(crate) mod test_support {
    //! A state whose users come from a fixture passwd naming the test process's own uid,
    //! so handlers resolve `~` into a temporary home.

    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use crate::state::EnvdState;
    use crate::users::UserDb;

    /// A temporary directory removed on drop, holding `etc/passwd` and `home/`.
    pub struct Sandbox {
        pub root: PathBuf,
        pub state: Arc<EnvdState>,
    }

    impl Sandbox {
        pub fn new(name: &str) -> Self {
            let root = std::env::temp_dir()
                .join(format!("berth-envd-files-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("etc")).unwrap();
            std::fs::create_dir_all(root.join("home")).unwrap();
            let uid = rustix::process::geteuid().as_raw();
            let gid = rustix::process::getegid().as_raw();
            std::fs::write(
                root.join("etc/passwd"),
                format!(
                    "tester:x:{uid}:{gid}::{}:/bin/sh\n",
                    root.join("home").display()
                ),
            )
            .unwrap();
            std::fs::write(root.join("etc/group"), format!("testers:x:{gid}:\n")).unwrap();
            let state = EnvdState {
                users: UserDb::with_root(&root),
                ..EnvdState::default()
            };
            state.defaults.write().unwrap().user = Some("tester".into());
            Self {
                root,
                state: Arc::new(state),
            }
        }

        pub fn home(&self) -> PathBuf {
            self.root.join("home")
        }

        pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
            self.home().join(rel)
        }
    }

    impl Drop for Sandbox {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_to_statuses() {
        let p = Path::new("/x/y");
        let full = io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(
            HttpError::io("writing", p, &full).status,
            StatusCode::INSUFFICIENT_STORAGE
        );
        let quota = io::Error::from_raw_os_error(libc::EDQUOT);
        assert_eq!(
            HttpError::io("writing", p, &quota).status,
            StatusCode::INSUFFICIENT_STORAGE
        );
        let missing = io::Error::from_raw_os_error(libc::ENOENT);
        let err = HttpError::io("opening", p, &missing);
        assert_eq!(err.status, StatusCode::NOT_FOUND);
        assert_eq!(err.message, "path '/x/y' does not exist");
        for refused in [libc::EACCES, libc::EPERM, libc::EROFS] {
            let err = HttpError::io(
                "error opening file",
                p,
                &io::Error::from_raw_os_error(refused),
            );
            assert_eq!(err.status, StatusCode::FORBIDDEN);
            assert!(err.message.starts_with("error opening file '/x/y': "));
        }
        let broken = io::Error::from_raw_os_error(libc::EIO);
        let err = HttpError::io("error opening file", p, &broken);
        assert_eq!(err.status, StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn ensure_dirs_creates_and_refuses_files() {
        let sb = test_support::Sandbox::new("ensure-dirs");
        let user = sb.state.users.lookup("tester").unwrap();
        let deep = sb.path("a/b/c");
        ensure_dirs(&deep, &user).unwrap();
        assert!(deep.is_dir());
        ensure_dirs(&deep, &user).unwrap();
        std::fs::write(sb.path("f"), b"x").unwrap();
        let err = ensure_dirs(&sb.path("f/g"), &user).unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(
            err.message.contains("is not a directory"),
            "{}",
            err.message
        );
    }
}

#[cfg(test)]
pub(crate) mod test_http {
    //! Drives [`super::router`] in-process.

    use axum::body::Body;
    use axum::http::{Request, Response, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use super::test_support::Sandbox;

    pub async fn send(sb: &Sandbox, request: Request<Body>) -> Response<Body> {
        super::router()
            .with_state(sb.state.clone())
            .oneshot(request)
            .await
            .unwrap()
    }

    pub async fn body_bytes(response: Response<Body>) -> Vec<u8> {
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec()
    }

    /// Sends, expects `status`, and returns the JSON body.
    pub async fn json(
        sb: &Sandbox,
        request: Request<Body>,
        status: StatusCode,
    ) -> serde_json::Value {
        let response = send(sb, request).await;
        let got = response.status();
        let bytes = body_bytes(response).await;
        assert_eq!(got, status, "body: {}", String::from_utf8_lossy(&bytes));
        serde_json::from_slice(&bytes).unwrap()
    }
}
