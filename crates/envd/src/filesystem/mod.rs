//! The Filesystem Connect service (`filesystem.Filesystem`, 9 RPCs), with E2B envd's
//! semantics:
//!
//! - Paths resolve like everywhere in envd (`users::resolve_path`) for the user named by
//!   `Authorization: Basic`, else the `/init` default user, else envd's own user.
//! - `Stat` describes the path itself (a symlink is reported as a symlink).
//! - `ListDir` follows a symlinked directory, lists `depth` levels (0 means 1: direct
//!   children), in name order, parents before their children, without descending into
//!   symlinked directories; entry paths are under the requested path.
//! - `MakeDir` creates parents too (owned by the user); an existing directory is
//!   `already_exists`, an existing non-directory `invalid_argument`.
//! - `Move` creates the destination's parents and renames.
//! - `Remove` removes files, symlinks and whole trees; a missing path is not an error
//!   (E2B's `RemoveAll`).
//! - `WatchDir` streams `StartEvent`, then events; `CreateWatcher` / `GetWatcherEvents`
//!   / `RemoveWatcher` buffer the same events for polling. Watches on NFS/CIFS/FUSE are
//!   refused unless `allow_network_mounts`.
//!
//! Errors: a missing path is `not_found`, an existing one in the way `already_exists`,
//! an unusable request `invalid_argument`, an unknown user `unauthenticated`; messages
//! name the path.

pub mod entry;
pub mod watch;

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::http::{HeaderMap, StatusCode};
use axum::Router;
use berth_envd_proto::connect::{Code, ConnectError};
use berth_envd_proto::filesystem::{
    watch_dir_response, CreateWatcherRequest, CreateWatcherResponse, EntryInfo, FilesystemEvent,
    GetWatcherEventsRequest, GetWatcherEventsResponse, ListDirRequest, ListDirResponse,
    MakeDirRequest, MakeDirResponse, MoveRequest, MoveResponse, RemoveRequest, RemoveResponse,
    RemoveWatcherRequest, RemoveWatcherResponse, StatRequest, StatResponse, WatchDirRequest,
    WatchDirResponse,
};
use berth_envd_proto::routes;
use futures::{Stream, StreamExt};

use crate::connect::{self, RpcContext};
use crate::files::{self, HttpError};
use crate::state::EnvdState;
use crate::users::{basic_auth_username, resolve_path, IdNames, User, UserError};
use watch::{Change, DirWatcher};

/// The Filesystem service: shared state plus the polling watchers.
pub struct FilesystemService {
    state: Arc<EnvdState>,
    watchers: Mutex<HashMap<String, PollingWatcher>>,
}

/// Events a polling watcher holds before it gives up (nobody is collecting them).
const MAX_BUFFERED_EVENTS: usize = 100_000;

/// A `CreateWatcher` watch: a task buffering events until `GetWatcherEvents` takes them.
struct PollingWatcher {
    buffer: Arc<Mutex<WatcherBuffer>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct WatcherBuffer {
    events: Vec<FilesystemEvent>,
    /// Set when the watch broke; reported by the next `GetWatcherEvents`.
    error: Option<ConnectError>,
}

impl Drop for PollingWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FilesystemService {
    pub fn new(state: Arc<EnvdState>) -> Arc<Self> {
        Arc::new(Self {
            state,
            watchers: Mutex::new(HashMap::new()),
        })
    }

    /// The service's routes, under `/filesystem.Filesystem/`.
    pub fn router(self: &Arc<Self>) -> Router {
        macro_rules! unary {
            ($method:ident, $request:ty) => {{
                let service = Arc::clone(self);
                connect::unary(move |ctx: RpcContext, request: $request| {
                    let service = Arc::clone(&service);
                    async move { service.$method(&ctx.headers, request).await }
                })
            }};
        }
        let watch_service = Arc::clone(self);
        Router::new()
            .route(routes::FILESYSTEM_STAT, unary!(stat, StatRequest))
            .route(
                routes::FILESYSTEM_MAKE_DIR,
                unary!(make_dir, MakeDirRequest),
            )
            .route(routes::FILESYSTEM_MOVE, unary!(move_entry, MoveRequest))
            .route(
                routes::FILESYSTEM_LIST_DIR,
                unary!(list_dir, ListDirRequest),
            )
            .route(routes::FILESYSTEM_REMOVE, unary!(remove, RemoveRequest))
            .route(
                routes::FILESYSTEM_WATCH_DIR,
                connect::server_stream(move |ctx: RpcContext, request: WatchDirRequest| {
                    let service = Arc::clone(&watch_service);
                    async move { service.watch_dir(&ctx.headers, request) }
                }),
            )
            .route(
                routes::FILESYSTEM_CREATE_WATCHER,
                unary!(create_watcher, CreateWatcherRequest),
            )
            .route(
                routes::FILESYSTEM_GET_WATCHER_EVENTS,
                unary!(get_watcher_events, GetWatcherEventsRequest),
            )
            .route(
                routes::FILESYSTEM_REMOVE_WATCHER,
                unary!(remove_watcher, RemoveWatcherRequest),
            )
    }

    /// The calling user and the absolute path `path` names for them.
    fn resolve(&self, headers: &HeaderMap, path: &str) -> Result<(User, PathBuf), ConnectError> {
        let user = request_user(&self.state, headers)?;
        let workdir = files::defaults(&self.state).workdir;
        let resolved = resolve_path(path, &user, workdir.as_deref())
            .map_err(|e| ConnectError::invalid_argument(e.to_string()))?;
        Ok((user, resolved))
    }

    fn id_names(&self) -> IdNames {
        // Without passwd, owners are shown as numbers; that must not fail a call.
        self.state.users.id_names().unwrap_or_default()
    }

    async fn stat(
        &self,
        headers: &HeaderMap,
        request: StatRequest,
    ) -> Result<StatResponse, ConnectError> {
        let (_, path) = self.resolve(headers, &request.path)?;
        let names = self.id_names();
        let entry = blocking(move || stat_entry(&path, &names)).await?;
        Ok(StatResponse { entry: Some(entry) })
    }

    async fn make_dir(
        &self,
        headers: &HeaderMap,
        request: MakeDirRequest,
    ) -> Result<MakeDirResponse, ConnectError> {
        let (user, path) = self.resolve(headers, &request.path)?;
        let names = self.id_names();
        let entry = blocking(move || {
            match std::fs::metadata(&path) {
                Ok(meta) if meta.is_dir() => {
                    return Err(ConnectError::new(
                        Code::AlreadyExists,
                        format!("directory already exists: {}", path.display()),
                    ))
                }
                Ok(_) => {
                    return Err(ConnectError::invalid_argument(format!(
                        "path already exists but it is not a directory: {}",
                        path.display()
                    )))
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("error checking", &path, &e)),
            }
            files::ensure_dirs(&path, &user).map_err(http_to_connect)?;
            stat_entry(&path, &names)
        })
        .await?;
        Ok(MakeDirResponse { entry: Some(entry) })
    }

    async fn move_entry(
        &self,
        headers: &HeaderMap,
        request: MoveRequest,
    ) -> Result<MoveResponse, ConnectError> {
        let (user, source) = self.resolve(headers, &request.source)?;
        let (_, destination) = self.resolve(headers, &request.destination)?;
        let names = self.id_names();
        let entry = blocking(move || {
            if let Err(e) = std::fs::symlink_metadata(&source) {
                return Err(if e.kind() == io::ErrorKind::NotFound {
                    ConnectError::not_found(format!("source file not found: {}", source.display()))
                } else {
                    io_error("error checking", &source, &e)
                });
            }
            if let Some(parent) = destination.parent() {
                files::ensure_dirs(parent, &user).map_err(http_to_connect)?;
            }
            std::fs::rename(&source, &destination).map_err(|e| {
                let what = format!(
                    "error moving '{}' to '{}'",
                    source.display(),
                    destination.display()
                );
                match e.raw_os_error() {
                    Some(libc::ENOTEMPTY) | Some(libc::EEXIST) => ConnectError::new(
                        Code::AlreadyExists,
                        format!("{what}: destination exists and is not empty"),
                    ),
                    Some(libc::ENOTDIR) | Some(libc::EISDIR) | Some(libc::EINVAL) => {
                        ConnectError::invalid_argument(format!("{what}: {e}"))
                    }
                    Some(libc::ENOENT) => ConnectError::not_found(format!("{what}: {e}")),
                    _ => ConnectError::internal(format!("{what}: {e}")),
                }
            })?;
            stat_entry(&destination, &names)
        })
        .await?;
        Ok(MoveResponse { entry: Some(entry) })
    }

    async fn list_dir(
        &self,
        headers: &HeaderMap,
        request: ListDirRequest,
    ) -> Result<ListDirResponse, ConnectError> {
        let (_, path) = self.resolve(headers, &request.path)?;
        let depth = request.depth.max(1);
        let names = self.id_names();
        let entries = blocking(move || {
            let resolved = std::fs::canonicalize(&path).map_err(|e| {
                if e.raw_os_error() == Some(libc::ELOOP) {
                    ConnectError::new(
                        Code::FailedPrecondition,
                        format!(
                            "cyclic symlink or chain of too many links at '{}'",
                            path.display()
                        ),
                    )
                } else {
                    io_error("error resolving", &path, &e)
                }
            })?;
            if !resolved.is_dir() {
                return Err(ConnectError::invalid_argument(format!(
                    "path is not a directory: {}",
                    path.display()
                )));
            }
            let mut entries = Vec::new();
            walk(&resolved, &path, depth, &names, &mut entries)?;
            Ok(entries)
        })
        .await?;
        Ok(ListDirResponse { entries })
    }

    async fn remove(
        &self,
        headers: &HeaderMap,
        request: RemoveRequest,
    ) -> Result<RemoveResponse, ConnectError> {
        let (_, path) = self.resolve(headers, &request.path)?;
        blocking(move || {
            let result = match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&path),
                Ok(_) => std::fs::remove_file(&path),
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io_error("error removing", &path, &e)),
            }
        })
        .await?;
        Ok(RemoveResponse {})
    }

    /// Checks a watch request and starts the inotify watch.
    fn start_watch(
        &self,
        headers: &HeaderMap,
        path: &str,
        recursive: bool,
        allow_network_mounts: bool,
    ) -> Result<DirWatcher, ConnectError> {
        let (_, path) = self.resolve(headers, path)?;
        let meta = std::fs::metadata(&path).map_err(|e| io_error("error statting", &path, &e))?;
        if !meta.is_dir() {
            return Err(ConnectError::invalid_argument(format!(
                "path {} not a directory",
                path.display()
            )));
        }
        let on_network = watch::is_network_mount(&path)
            .map_err(|e| io_error("error checking mount status of", &path, &e))?;
        if on_network && !allow_network_mounts {
            return Err(ConnectError::invalid_argument(format!(
                "cannot watch path on network filesystem: {} (set allow_network_mounts to try anyway)",
                path.display()
            )));
        }
        DirWatcher::new(&path, recursive).map_err(|e| io_error("error watching", &path, &e))
    }

    fn watch_dir(
        &self,
        headers: &HeaderMap,
        request: WatchDirRequest,
    ) -> Result<impl Stream<Item = Result<WatchDirResponse, ConnectError>> + use<>, ConnectError>
    {
        let watcher = self.start_watch(
            headers,
            &request.path,
            request.recursive,
            request.allow_network_mounts,
        )?;
        let start = WatchDirResponse {
            event: Some(watch_dir_response::Event::Start(
                watch_dir_response::StartEvent {},
            )),
        };
        let state = Arc::clone(&self.state);
        let include_entry = request.include_entry;
        let events = futures::stream::unfold(Some(watcher), move |watcher| {
            let state = Arc::clone(&state);
            async move {
                let mut watcher = watcher?;
                match watcher.next().await {
                    Ok(changes) => {
                        let events = to_events(&state, changes, include_entry);
                        Some((Ok(events), Some(watcher)))
                    }
                    Err(e) => Some((
                        Err(ConnectError::internal(format!("watcher error: {e}"))),
                        None,
                    )),
                }
            }
        })
        .flat_map(|batch| {
            let items: Vec<Result<WatchDirResponse, ConnectError>> = match batch {
                Ok(events) => events
                    .into_iter()
                    .map(|event| {
                        Ok(WatchDirResponse {
                            event: Some(watch_dir_response::Event::Filesystem(event)),
                        })
                    })
                    .collect(),
                Err(e) => vec![Err(e)],
            };
            futures::stream::iter(items)
        });
        Ok(futures::stream::once(async move { Ok(start) }).chain(events))
    }

    async fn create_watcher(
        &self,
        headers: &HeaderMap,
        request: CreateWatcherRequest,
    ) -> Result<CreateWatcherResponse, ConnectError> {
        let mut watcher = self.start_watch(
            headers,
            &request.path,
            request.recursive,
            request.allow_network_mounts,
        )?;
        let buffer = Arc::new(Mutex::new(WatcherBuffer::default()));
        let task = {
            let buffer = Arc::clone(&buffer);
            let state = Arc::clone(&self.state);
            let include_entry = request.include_entry;
            tokio::spawn(async move {
                loop {
                    match watcher.next().await {
                        Ok(changes) => {
                            let events = to_events(&state, changes, include_entry);
                            let mut buffer = lock(&buffer);
                            buffer.events.extend(events);
                            if buffer.events.len() > MAX_BUFFERED_EVENTS {
                                buffer.error = Some(ConnectError::new(
                                    Code::ResourceExhausted,
                                    format!("watcher stopped: more than {MAX_BUFFERED_EVENTS} events were not collected"),
                                ));
                                return;
                            }
                        }
                        Err(e) => {
                            lock(&buffer).error =
                                Some(ConnectError::internal(format!("watcher error: {e}")));
                            return;
                        }
                    }
                }
            })
        };
        let watcher_id = new_watcher_id();
        lock(&self.watchers).insert(watcher_id.clone(), PollingWatcher { buffer, task });
        Ok(CreateWatcherResponse { watcher_id })
    }

    async fn get_watcher_events(
        &self,
        _headers: &HeaderMap,
        request: GetWatcherEventsRequest,
    ) -> Result<GetWatcherEventsResponse, ConnectError> {
        let watchers = lock(&self.watchers);
        let watcher = watchers
            .get(&request.watcher_id)
            .ok_or_else(|| unknown_watcher(&request.watcher_id))?;
        let mut buffer = lock(&watcher.buffer);
        if let Some(error) = buffer.error.clone() {
            return Err(error);
        }
        Ok(GetWatcherEventsResponse {
            events: std::mem::take(&mut buffer.events),
        })
    }

    async fn remove_watcher(
        &self,
        _headers: &HeaderMap,
        request: RemoveWatcherRequest,
    ) -> Result<RemoveWatcherResponse, ConnectError> {
        // Dropping the watcher aborts its task, which closes the inotify instance.
        lock(&self.watchers)
            .remove(&request.watcher_id)
            .ok_or_else(|| unknown_watcher(&request.watcher_id))?;
        Ok(RemoveWatcherResponse {})
    }
}

fn unknown_watcher(id: &str) -> ConnectError {
    ConnectError::not_found(format!("watcher with id '{id}' not found"))
}

/// `w` + 16 hex digits, unpredictable enough that ids are not guessed by accident.
fn new_watcher_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // RandomState is seeded randomly per process and per instance.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("w{:016x}", hasher.finish())
}

/// The user a call acts as: `Authorization: Basic`, else the `/init` default, else
/// envd's own user.
fn request_user(state: &EnvdState, headers: &HeaderMap) -> Result<User, ConnectError> {
    let explicit = match headers.get(axum::http::header::AUTHORIZATION) {
        Some(value) => {
            let value = value.to_str().map_err(|_| {
                ConnectError::new(
                    Code::Unauthenticated,
                    "invalid Authorization header: not ASCII",
                )
            })?;
            basic_auth_username(value).map_err(user_error)?
        }
        None => None,
    };
    let default_user = files::defaults(state).user;
    state
        .users
        .resolve(explicit.as_deref(), default_user.as_deref())
        .map_err(user_error)
}

fn user_error(err: UserError) -> ConnectError {
    match err {
        UserError::UnknownUser(name) => {
            ConnectError::new(Code::Unauthenticated, format!("invalid username: '{name}'"))
        }
        UserError::InvalidAuthorization(_) => {
            ConnectError::new(Code::Unauthenticated, err.to_string())
        }
        UserError::Read { .. } => ConnectError::internal(err.to_string()),
    }
}

/// Runs filesystem work off the async runtime.
async fn blocking<T, F>(work: F) -> Result<T, ConnectError>
where
    F: FnOnce() -> Result<T, ConnectError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ConnectError::internal(format!("filesystem task failed: {e}")))?
}

/// An I/O failure while doing `action` on `path`, with the Connect code that fits.
/// The `EntryInfo` of `path`, with stat errors mapped to Connect codes.
fn stat_entry(path: &Path, names: &IdNames) -> Result<EntryInfo, ConnectError> {
    entry::entry_info(path, names).map_err(|e| io_error("error statting", path, &e))
}

fn io_error(action: &str, path: &Path, err: &io::Error) -> ConnectError {
    let code = match err.kind() {
        io::ErrorKind::NotFound => Code::NotFound,
        io::ErrorKind::PermissionDenied => Code::PermissionDenied,
        io::ErrorKind::AlreadyExists => Code::AlreadyExists,
        _ if err.raw_os_error() == Some(libc::ENOTDIR) => Code::InvalidArgument,
        _ if files::is_disk_full(err) => Code::ResourceExhausted,
        _ => Code::Internal,
    };
    if code == Code::NotFound {
        return ConnectError::not_found(format!("path '{}' does not exist", path.display()));
    }
    ConnectError::new(code, format!("{action} '{}': {err}", path.display()))
}

fn http_to_connect(err: HttpError) -> ConnectError {
    let code = match err.status {
        StatusCode::BAD_REQUEST => Code::InvalidArgument,
        StatusCode::NOT_FOUND => Code::NotFound,
        StatusCode::INSUFFICIENT_STORAGE => Code::ResourceExhausted,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        _ => Code::Internal,
    };
    ConnectError::new(code, err.message)
}

/// Lists `dir` (really at `real_dir`) `depth` levels deep into `out`, entries named under
/// `shown_dir`. Unreadable subdirectories are listed but not entered.
fn walk(
    real_dir: &Path,
    shown_dir: &Path,
    depth: u32,
    names: &IdNames,
    out: &mut Vec<EntryInfo>,
) -> Result<(), ConnectError> {
    let read = std::fs::read_dir(real_dir)
        .map_err(|e| io_error("error reading directory", shown_dir, &e))?;
    let mut children: Vec<_> = read.filter_map(Result::ok).collect();
    children.sort_by_key(|c| c.file_name());
    for child in children {
        let real = child.path();
        let shown = shown_dir.join(child.file_name());
        let Ok(mut info) = entry::entry_info(&real, names) else {
            // Vanished between readdir and lstat.
            continue;
        };
        info.path = shown.to_string_lossy().into_owned();
        let descend = depth > 1 && child.file_type().is_ok_and(|t| t.is_dir());
        out.push(info);
        if descend {
            // A subdirectory we cannot read still appears, just without children.
            let _ = walk(&real, &shown, depth - 1, names, out);
        }
    }
    Ok(())
}

/// Wire events for `changes`, with entry info when asked and the entry still exists.
fn to_events(state: &EnvdState, changes: Vec<Change>, include_entry: bool) -> Vec<FilesystemEvent> {
    let names = if include_entry {
        state.users.id_names().unwrap_or_default()
    } else {
        IdNames::default()
    };
    changes
        .into_iter()
        .map(|change| FilesystemEvent {
            entry: if include_entry {
                entry::entry_info(&change.path, &names).ok()
            } else {
                None
            },
            name: change.name,
            r#type: change.kind as i32,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use axum::http::Request;
    use base64::Engine;
    use http_body_util::BodyExt;
    use serde_json::{json, Value};
    use tower::ServiceExt;

    use super::*;
    use crate::files::test_support::Sandbox;

    async fn call(sb: &Sandbox, method: &str, body: Value) -> (StatusCode, Value) {
        call_as(sb, method, body, None).await
    }

    async fn call_as(
        sb: &Sandbox,
        method: &str,
        body: Value,
        user: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut request = Request::post(format!("/filesystem.Filesystem/{method}"))
            .header("content-type", "application/json");
        if let Some(user) = user {
            let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
            request = request.header("authorization", format!("Basic {credentials}"));
        }
        let response = FilesystemService::new(sb.state.clone())
            .router()
            .oneshot(request.body(Body::from(body.to_string())).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    fn p(sb: &Sandbox, rel: &str) -> String {
        sb.path(rel).to_string_lossy().into_owned()
    }

    #[tokio::test]
    async fn stat_describes_entries_and_names_missing_paths() {
        let sb = Sandbox::new("fs-stat");
        std::fs::write(sb.path("f.txt"), b"abc").unwrap();
        let (status, body) = call(&sb, "Stat", json!({"path": "f.txt"})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let entry = &body["entry"];
        assert_eq!(entry["name"], "f.txt");
        assert_eq!(entry["type"], "FILE_TYPE_FILE");
        assert_eq!(entry["path"], p(&sb, "f.txt"));
        assert_eq!(entry["size"], "3");
        assert_eq!(entry["owner"], "tester");
        assert_eq!(entry["group"], "testers");
        assert!(entry["permissions"].as_str().unwrap().starts_with("-rw"));
        assert!(entry["modifiedTime"].as_str().unwrap().ends_with('Z'));

        let (status, body) = call(&sb, "Stat", json!({"path": "nope"})).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["code"], "not_found");
        assert!(body["message"].as_str().unwrap().contains(&p(&sb, "nope")));

        let (status, body) = call_as(&sb, "Stat", json!({"path": "f.txt"}), Some("ghost")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(body["code"], "unauthenticated");

        let (status, body) = call(&sb, "Stat", json!({"path": "~other/x"})).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["code"], "invalid_argument");
    }

    #[tokio::test]
    async fn make_dir_creates_parents_and_refuses_existing() {
        let sb = Sandbox::new("fs-mkdir");
        let (status, body) = call(&sb, "MakeDir", json!({"path": "a/b/c"})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["entry"]["type"], "FILE_TYPE_DIRECTORY");
        assert_eq!(body["entry"]["path"], p(&sb, "a/b/c"));
        assert!(sb.path("a/b/c").is_dir());
        let (status, body) = call(&sb, "MakeDir", json!({"path": "a/b"})).await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(body["code"], "already_exists");
        std::fs::write(sb.path("file"), b"").unwrap();
        let (_, body) = call(&sb, "MakeDir", json!({"path": "file"})).await;
        assert_eq!(body["code"], "invalid_argument");
        let (_, body) = call(&sb, "MakeDir", json!({"path": "file/sub"})).await;
        assert_eq!(body["code"], "invalid_argument", "{body}");
    }

    #[tokio::test]
    async fn list_dir_depth_order_and_symlinked_dirs() {
        let sb = Sandbox::new("fs-list");
        std::fs::create_dir_all(sb.path("d/sub/deeper")).unwrap();
        std::fs::write(sb.path("d/b.txt"), b"").unwrap();
        std::fs::write(sb.path("d/a.txt"), b"").unwrap();
        std::fs::write(sb.path("d/sub/c.txt"), b"").unwrap();
        std::os::unix::fs::symlink(sb.path("d"), sb.path("link")).unwrap();
        let names = |body: &Value| -> Vec<String> {
            body["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["path"].as_str().unwrap().to_owned())
                .collect()
        };
        let (status, body) = call(&sb, "ListDir", json!({"path": "d"})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            names(&body),
            vec![p(&sb, "d/a.txt"), p(&sb, "d/b.txt"), p(&sb, "d/sub")]
        );
        let (_, body) = call(&sb, "ListDir", json!({"path": "d", "depth": 2})).await;
        assert_eq!(
            names(&body),
            vec![
                p(&sb, "d/a.txt"),
                p(&sb, "d/b.txt"),
                p(&sb, "d/sub"),
                p(&sb, "d/sub/c.txt"),
                p(&sb, "d/sub/deeper")
            ]
        );
        let (_, body) = call(&sb, "ListDir", json!({"path": "link", "depth": 1})).await;
        assert_eq!(
            names(&body),
            vec![
                p(&sb, "link/a.txt"),
                p(&sb, "link/b.txt"),
                p(&sb, "link/sub")
            ]
        );
        let (_, body) = call(&sb, "ListDir", json!({"path": "d/a.txt"})).await;
        assert_eq!(body["code"], "invalid_argument");
        let (_, body) = call(&sb, "ListDir", json!({"path": "missing"})).await;
        assert_eq!(body["code"], "not_found");
    }

    #[tokio::test]
    async fn move_and_remove() {
        let sb = Sandbox::new("fs-move");
        std::fs::write(sb.path("src.txt"), b"data").unwrap();
        let (status, body) = call(
            &sb,
            "Move",
            json!({"source": "src.txt", "destination": "new/dir/dst.txt"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["entry"]["path"], p(&sb, "new/dir/dst.txt"));
        assert_eq!(std::fs::read(sb.path("new/dir/dst.txt")).unwrap(), b"data");
        assert!(!sb.path("src.txt").exists());
        let (_, body) = call(
            &sb,
            "Move",
            json!({"source": "src.txt", "destination": "x"}),
        )
        .await;
        assert_eq!(body["code"], "not_found");
        assert!(body["message"]
            .as_str()
            .unwrap()
            .contains(&p(&sb, "src.txt")));

        let (status, _) = call(&sb, "Remove", json!({"path": "new"})).await;
        assert_eq!(status, StatusCode::OK);
        assert!(!sb.path("new").exists());
        let (status, _) = call(&sb, "Remove", json!({"path": "new"})).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "removing a missing path is not an error"
        );
    }

    /// Reads Connect stream envelopes from `body` until `done` says enough.
    async fn read_envelopes(
        body: &mut Body,
        buffer: &mut Vec<u8>,
        mut done: impl FnMut(&[Value]) -> bool,
    ) -> Vec<Value> {
        let mut messages = Vec::new();
        while !done(&messages) {
            let frame = tokio::time::timeout(Duration::from_secs(20), body.frame())
                .await
                .unwrap_or_else(|_| panic!("stream stalled after {messages:?}"))
                .expect("stream ended")
                .unwrap();
            if let Ok(data) = frame.into_data() {
                buffer.extend_from_slice(&data);
            }
            while buffer.len() >= 5 {
                let len = u32::from_be_bytes(buffer[1..5].try_into().unwrap()) as usize;
                if buffer.len() < 5 + len {
                    break;
                }
                messages.push(serde_json::from_slice(&buffer[5..5 + len]).unwrap());
                buffer.drain(..5 + len);
            }
        }
        messages
    }

    fn envelope(message: &Value) -> Vec<u8> {
        let payload = message.to_string().into_bytes();
        let mut out = vec![0u8];
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&payload);
        out
    }

    #[tokio::test]
    async fn watch_dir_streams_start_then_events_with_entries() {
        let sb = Sandbox::new("fs-watch");
        std::fs::create_dir(sb.path("w")).unwrap();
        let request = Request::post("/filesystem.Filesystem/WatchDir")
            .header("content-type", "application/connect+json")
            .body(Body::from(envelope(
                &json!({"path": "w", "recursive": true, "includeEntry": true}),
            )))
            .unwrap();
        let response = FilesystemService::new(sb.state.clone())
            .router()
            .oneshot(request)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let mut body = response.into_body();
        // Bytes of a frame split across reads carry over between calls.
        let mut pending = Vec::new();
        let first = read_envelopes(&mut body, &mut pending, |m| !m.is_empty()).await;
        assert_eq!(first[0], json!({"start": {}}));
        std::fs::create_dir(sb.path("w/sub")).unwrap();
        let is = |e: &Value, name: &str, kind: &str| {
            e["filesystem"]["name"] == name && e["filesystem"]["type"] == kind
        };
        let events = read_envelopes(&mut body, &mut pending, |m| {
            m.iter().any(|e| is(e, "sub", "EVENT_TYPE_CREATE"))
        })
        .await;
        let create = events
            .iter()
            .find(|e| is(e, "sub", "EVENT_TYPE_CREATE"))
            .unwrap();
        assert_eq!(create["filesystem"]["entry"]["type"], "FILE_TYPE_DIRECTORY");
        assert_eq!(create["filesystem"]["entry"]["path"], p(&sb, "w/sub"));
        // The new subdirectory is watched too.
        std::fs::write(sb.path("w/sub/f.txt"), b"hello").unwrap();
        let events = read_envelopes(&mut body, &mut pending, |m| {
            m.iter().any(|e| is(e, "sub/f.txt", "EVENT_TYPE_WRITE"))
        })
        .await;
        let write = events
            .iter()
            .find(|e| is(e, "sub/f.txt", "EVENT_TYPE_WRITE"))
            .unwrap();
        assert_eq!(write["filesystem"]["entry"]["size"], "5");

        let not_dir = Request::post("/filesystem.Filesystem/WatchDir")
            .header("content-type", "application/connect+json")
            .body(Body::from(envelope(&json!({"path": "missing"}))))
            .unwrap();
        let response = FilesystemService::new(sb.state.clone())
            .router()
            .oneshot(not_dir)
            .await
            .unwrap();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let end: Value = serde_json::from_slice(&bytes[5..]).unwrap();
        assert_eq!(bytes[0], 2, "end-of-stream frame");
        assert_eq!(end["error"]["code"], "not_found");
    }

    #[tokio::test]
    async fn polling_watcher_buffers_events() {
        let sb = Sandbox::new("fs-poll");
        let service = FilesystemService::new(sb.state.clone());
        let router = service.router();
        let post = |method: &str, body: Value| {
            Request::post(format!("/filesystem.Filesystem/{method}"))
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .unwrap()
        };
        let json_of = |response: axum::response::Response| async move {
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            serde_json::from_slice::<Value>(&bytes).unwrap()
        };
        let created = json_of(
            router
                .clone()
                .oneshot(post("CreateWatcher", json!({"path": "~"})))
                .await
                .unwrap(),
        )
        .await;
        let id = created["watcherId"].as_str().unwrap().to_owned();
        assert!(id.starts_with('w'));
        std::fs::write(sb.path("polled.txt"), b"x").unwrap();
        let mut seen = Vec::new();
        for _ in 0..400 {
            let got = json_of(
                router
                    .clone()
                    .oneshot(post("GetWatcherEvents", json!({"watcherId": id})))
                    .await
                    .unwrap(),
            )
            .await;
            seen.extend(got["events"].as_array().cloned().unwrap_or_default());
            if seen.iter().any(|e| e["name"] == "polled.txt") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            seen.iter()
                .any(|e| e["name"] == "polled.txt" && e["type"] == "EVENT_TYPE_CREATE"),
            "{seen:?}"
        );
        let removed = router
            .clone()
            .oneshot(post("RemoveWatcher", json!({"watcherId": id})))
            .await
            .unwrap();
        assert_eq!(removed.status(), StatusCode::OK);
        let gone = json_of(
            router
                .clone()
                .oneshot(post("GetWatcherEvents", json!({"watcherId": id})))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(gone["code"], "not_found");
        assert!(lock(&service.watchers).is_empty());
    }
}
