//! The volume content API (`/volumecontent/{volumeID}/…`, E2B's
//! `openapi-volumecontent.yml`): path info, directory list and create, file download and
//! upload, metadata changes and deletes, authorised by the volume's own token
//! (`Authorization: Bearer <token>`), so the SDK's `Volume` file methods work without any
//! sandbox. The SDK finds it through `E2B_VOLUME_API_URL` (berth's API URL).
//!
//! Every path is resolved beneath the volume's root directory with `openat2`
//! (`RESOLVE_IN_ROOT`, no magic links): `..` and symlinks a sandbox planted can never
//! reach outside the volume. The final component of a path is never followed (`lstat`
//! semantics): a symlink is reported, changed and deleted as itself. Uploads stream into
//! a temporary file beside the target and are renamed over it when complete; a full
//! volume is 507. New entries belong, unless `uid`/`gid` say otherwise, to the owner of
//! their parent directory (a new volume's root is `user`'s), so files written here stay
//! writable by the sandbox user. These routes are outside the API's 1 MiB body buffer.
//! Errors are `{code, message}` with a string code, as that spec says.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use http_body_util::BodyExt;
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::SharedState;

/// An error answer of the content API.
#[derive(Debug)]
pub struct ContentError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: &'a str,
}

impl IntoResponse for ContentError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = self.status.as_u16(), error = %self.message, "volume content");
        }
        (
            self.status,
            Json(ErrorBody {
                code: self.code,
                message: &self.message,
            }),
        )
            .into_response()
    }
}

impl ContentError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ContentError {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("path {path:?} not found"),
        )
    }

    /// The answer for a failed filesystem call on `path`.
    fn fs(path: &str, what: &str, errno: Errno) -> Self {
        match errno {
            Errno::NOENT => Self::not_found(path),
            Errno::NOTDIR => Self::bad_request(format!("{what} {path:?}: not a directory")),
            Errno::ISDIR => Self::bad_request(format!("{what} {path:?}: is a directory")),
            Errno::EXIST => Self::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("{what} {path:?}: already exists"),
            ),
            Errno::NOTEMPTY => Self::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("{what} {path:?}: directory not empty"),
            ),
            Errno::NOSPC | Errno::DQUOT => Self::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "insufficient_storage",
                format!("{what} {path:?}: the volume is full"),
            ),
            Errno::NAMETOOLONG | Errno::LOOP | Errno::XDEV | Errno::INVAL => {
                Self::bad_request(format!("{what} {path:?}: {errno}"))
            }
            other => Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("{what} {path:?}: {other}"),
            ),
        }
    }
}

fn internal(message: impl Into<String>) -> ContentError {
    ContentError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
}

/// One entry, as the spec's `VolumeEntryStat`.
#[derive(Debug, Serialize)]
pub struct EntryStat {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    size: i64,
    mode: u32,
    uid: u32,
    gid: u32,
    #[serde(with = "time::serde::rfc3339")]
    atime: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    mtime: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    ctime: OffsetDateTime,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
}

/// A request path inside the volume: its normalised form (`/a/b`, `/` for the root) and
/// its parent and last component.
struct VolumePath {
    display: String,
    parent: String,
    name: Option<String>,
}

impl VolumePath {
    fn parse(raw: &str) -> Result<Self, ContentError> {
        if raw.contains('\0') {
            return Err(ContentError::bad_request("path holds a NUL byte"));
        }
        let parts: Vec<&str> = raw
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect();
        if parts.contains(&"..") {
            return Err(ContentError::bad_request(format!(
                "path {raw:?}: `..` is not allowed"
            )));
        }
        let display = format!("/{}", parts.join("/"));
        match parts.split_last() {
            None => Ok(VolumePath {
                display,
                parent: ".".into(),
                name: None,
            }),
            Some((last, rest)) => Ok(VolumePath {
                display,
                parent: if rest.is_empty() {
                    ".".into()
                } else {
                    rest.join("/")
                },
                name: Some((*last).to_string()),
            }),
        }
    }

    fn name_or_root(&self) -> Result<&str, ContentError> {
        self.name.as_deref().ok_or_else(|| {
            ContentError::bad_request("the volume's root cannot be changed or removed")
        })
    }
}

const RESOLVE: ResolveFlags = ResolveFlags::IN_ROOT.union(ResolveFlags::NO_MAGICLINKS);

/// Directory `rel` beneath `root`.
fn open_dir(root: BorrowedFd<'_>, rel: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        root,
        rel,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        RESOLVE,
    )
}

fn time_of(seconds: i64, nanos: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(
        i128::from(seconds) * 1_000_000_000 + i128::from(nanos),
    )
    .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

fn kind_of(mode: u32) -> &'static str {
    match rustix::fs::FileType::from_raw_mode(mode) {
        rustix::fs::FileType::RegularFile => "file",
        rustix::fs::FileType::Directory => "directory",
        rustix::fs::FileType::Symlink => "symlink",
        _ => "unknown",
    }
}

/// Stat of entry `name` of directory `dir` (not followed), reported at `display`.
fn stat_entry(dir: BorrowedFd<'_>, name: &str, display: &str) -> Result<EntryStat, Errno> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    let kind = kind_of(st.st_mode);
    let target = if kind == "symlink" {
        rustix::fs::readlinkat(dir, name, Vec::new())
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    let shown_name = if display == "/" {
        String::new()
    } else {
        name.to_string()
    };
    Ok(EntryStat {
        name: shown_name,
        kind,
        path: display.to_string(),
        size: st.st_size,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        atime: time_of(st.st_atime, st.st_atime_nsec as i64),
        mtime: time_of(st.st_mtime, st.st_mtime_nsec as i64),
        ctime: time_of(st.st_ctime, st.st_ctime_nsec as i64),
        target,
    })
}

/// Stat of the whole path (the root, or its last component unfollowed).
fn stat_path(root: BorrowedFd<'_>, path: &VolumePath) -> Result<EntryStat, ContentError> {
    let dir =
        open_dir(root, &path.parent).map_err(|e| ContentError::fs(&path.display, "stat", e))?;
    let name = path.name.as_deref().unwrap_or(".");
    stat_entry(dir.as_fd(), name, &path.display)
        .map_err(|e| ContentError::fs(&path.display, "stat", e))
}

fn join(display: &str, name: &str) -> String {
    if display == "/" {
        format!("/{name}")
    } else {
        format!("{display}/{name}")
    }
}

/// Entries below directory `dir` down to `depth` levels (1: its children).
fn list_dir(
    dir: BorrowedFd<'_>,
    display: &str,
    depth: u32,
    out: &mut Vec<EntryStat>,
) -> Result<(), Errno> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            names.push(name);
        }
    }
    names.sort();
    for name in names {
        let path = join(display, &name);
        let stat = match stat_entry(dir, &name, &path) {
            Ok(stat) => stat,
            // Removed between the listing and the stat.
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(e),
        };
        let is_dir = stat.kind == "directory";
        out.push(stat);
        if is_dir && depth > 1 {
            let child = rustix::fs::openat(
                dir,
                name.as_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            list_dir(child.as_fd(), &path, depth - 1, out)?;
        }
    }
    Ok(())
}

/// Removes entry `name` of `dir`, recursively for a directory (never following links).
fn remove_entry(dir: BorrowedFd<'_>, name: &str) -> Result<(), Errno> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Directory {
        return rustix::fs::unlinkat(dir, name, AtFlags::empty());
    }
    let child = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(child.as_fd())? {
        let entry_name = entry?.file_name().to_string_lossy().into_owned();
        if entry_name != "." && entry_name != ".." {
            names.push(entry_name);
        }
    }
    for entry_name in names {
        remove_entry(child.as_fd(), &entry_name)?;
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
}

/// Owner for a new entry: the request's, else the parent directory's.
fn owner_for(
    parent: BorrowedFd<'_>,
    uid: Option<u32>,
    gid: Option<u32>,
) -> Result<(u32, u32), Errno> {
    let st = rustix::fs::fstat(parent)?;
    Ok((uid.unwrap_or(st.st_uid), gid.unwrap_or(st.st_gid)))
}

fn chown_entry(dir: BorrowedFd<'_>, name: &str, uid: u32, gid: u32) -> Result<(), Errno> {
    rustix::fs::chownat(
        dir,
        name,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )
}

/// Creates directory `path`, with its missing parents when `parents` (an existing
/// directory is then fine too).
fn make_dir(
    root: BorrowedFd<'_>,
    path: &VolumePath,
    parents: bool,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: u32,
) -> Result<EntryStat, ContentError> {
    let fail = |e| ContentError::fs(&path.display, "create directory", e);
    path.name_or_root()?;
    let components: Vec<&str> = path.display[1..].split('/').collect();
    let mut dir = open_dir(root, ".").map_err(fail)?;
    for (i, part) in components.iter().enumerate() {
        let last = i + 1 == components.len();
        if last || parents {
            let (owner, group) = owner_for(dir.as_fd(), uid, gid).map_err(fail)?;
            match rustix::fs::mkdirat(dir.as_fd(), *part, Mode::from_raw_mode(mode)) {
                Ok(()) => {
                    chown_entry(dir.as_fd(), part, owner, group).map_err(fail)?;
                    rustix::fs::chmodat(
                        dir.as_fd(),
                        *part,
                        Mode::from_raw_mode(mode),
                        AtFlags::empty(),
                    )
                    .map_err(fail)?;
                }
                Err(Errno::EXIST) if parents => {}
                Err(e) => return Err(fail(e)),
            }
        }
        if last {
            return stat_entry(dir.as_fd(), part, &path.display).map_err(fail);
        }
        dir = rustix::fs::openat2(
            dir.as_fd(),
            *part,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(fail)?;
    }
    Err(ContentError::bad_request("empty path"))
}

/// The volume's root, after checking the bearer token against volume `id`.
async fn authorise(
    state: &SharedState,
    id: &str,
    headers: &HeaderMap,
) -> Result<OwnedFd, ContentError> {
    let unauthorised = || {
        ContentError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or invalid volume token (Authorization: Bearer <token of this volume>)",
        )
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .ok_or_else(unauthorised)?;
    let volume = state
        .store
        .volume_any_team(id)
        .map_err(|e| internal(format!("looking up volume {id}: {e}")))?
        .ok_or_else(unauthorised)?;
    if !constant_time_eq(presented.as_bytes(), volume.token.as_bytes()) {
        return Err(unauthorised());
    }
    let runtime = state.runtime.clone();
    let owned = volume.id.clone();
    tokio::task::spawn_blocking(move || runtime.open_volume(&owned))
        .await
        .map_err(|e| internal(format!("volume {id}: worker failed: {e}")))?
        .map_err(|e| {
            internal(format!(
                "opening volume {id}: {}",
                crate::error::error_chain(&e)
            ))
        })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Runs filesystem work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ContentError> + Send + 'static,
) -> Result<T, ContentError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| internal(format!("volume worker failed: {e}")))?
}

#[derive(Debug, Deserialize)]
pub struct PathQuery {
    path: String,
}

#[derive(Debug, Deserialize)]
pub struct DirQuery {
    path: String,
    depth: Option<u32>,
}

#[derive(Debug, Deserialize)]
pub struct CreateQuery {
    path: String,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
    force: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub struct MetadataBody {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

async fn get_path(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    Query(query): Query<PathQuery>,
    headers: HeaderMap,
) -> Result<Json<EntryStat>, ContentError> {
    let root = authorise(&state, &id, &headers).await?;
    let path = VolumePath::parse(&query.path)?;
    blocking(move || stat_path(root.as_fd(), &path))
        .await
        .map(Json)
}

async fn patch_path(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    Query(query): Query<PathQuery>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<EntryStat>, ContentError> {
    let root = authorise(&state, &id, &headers).await?;
    let path = VolumePath::parse(&query.path)?;
    let changes: MetadataBody = serde_json::from_slice(&body)
        .map_err(|e| ContentError::bad_request(format!("invalid JSON body: {e}")))?;
    blocking(move || {
        let fail = |e| ContentError::fs(&path.display, "change", e);
        let dir = open_dir(root.as_fd(), &path.parent).map_err(fail)?;
        let name = path.name.as_deref().unwrap_or(".");
        if changes.uid.is_some() || changes.gid.is_some() {
            rustix::fs::chownat(
                dir.as_fd(),
                name,
                changes.uid.map(rustix::fs::Uid::from_raw),
                changes.gid.map(rustix::fs::Gid::from_raw),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(fail)?;
        }
        if let Some(mode) = changes.mode {
            rustix::fs::chmodat(
                dir.as_fd(),
                name,
                Mode::from_raw_mode(mode & 0o7777),
                AtFlags::empty(),
            )
            .map_err(fail)?;
        }
        stat_entry(dir.as_fd(), name, &path.display).map_err(fail)
    })
    .await
    .map(Json)
}

async fn delete_path(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    Query(query): Query<PathQuery>,
    headers: HeaderMap,
) -> Result<StatusCode, ContentError> {
    let root = authorise(&state, &id, &headers).await?;
    let path = VolumePath::parse(&query.path)?;
    blocking(move || {
        let fail = |e| ContentError::fs(&path.display, "remove", e);
        let name = path.name_or_root()?;
        let dir = open_dir(root.as_fd(), &path.parent).map_err(fail)?;
        remove_entry(dir.as_fd(), name).map_err(fail)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn list(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    Query(query): Query<DirQuery>,
    headers: HeaderMap,
) -> Result<Json<Vec<EntryStat>>, ContentError> {
    let root = authorise(&state, &id, &headers).await?;
    let path = VolumePath::parse(&query.path)?;
    let depth = query.depth.unwrap_or(1).clamp(1, 64);
    blocking(move || {
        let rel = if path.display == "/" {
            ".".to_string()
        } else {
            path.display.trim_start_matches('/').to_string()
        };
        let fail = |e| ContentError::fs(&path.display, "list", e);
        // The directory itself is not followed if it is a symlink.
        let st = stat_path(root.as_fd(), &path)?;
        if st.kind != "directory" {
            return Err(ContentError::bad_request(format!(
                "{:?} is not a directory",
                path.display
            )));
        }
        let dir = open_dir(root.as_fd(), &rel).map_err(fail)?;
        let mut entries = Vec::new();
        list_dir(dir.as_fd(), &path.display, depth, &mut entries).map_err(fail)?;
        Ok(entries)
    })
    .await
    .map(Json)
}

async fn make_directory(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    Query(query): Query<CreateQuery>,
    headers: HeaderMap,
) -> Result<(StatusCode, Json<EntryStat>), ContentError> {
    let root = authorise(&state, &id, &headers).await?;
    let path = VolumePath::parse(&query.path)?;
    let mode = query.mode.unwrap_or(0o755) & 0o7777;
    let parents = query.force.unwrap_or(false);
    let stat = blocking(move || make_dir(root.as_fd(), &path, parents, query.uid, query.gid, mode))
        .await?;
    Ok((StatusCode::CREATED, Json(stat)))
}

async fn download(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    Query(query): Query<PathQuery>,
    headers: HeaderMap,
) -> Result<Response, ContentError> {
    let root = authorise(&state, &id, &headers).await?;
    let path = VolumePath::parse(&query.path)?;
    let (file, size) = blocking(move || {
        let fail = |e| ContentError::fs(&path.display, "read", e);
        let rel = path.display.trim_start_matches('/').to_string();
        if rel.is_empty() {
            return Err(ContentError::bad_request("\"/\" is a directory"));
        }
        let fd = rustix::fs::openat2(
            root.as_fd(),
            rel.as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .map_err(fail)?;
        let st = rustix::fs::fstat(&fd).map_err(fail)?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(ContentError::bad_request(format!(
                "{:?} is not a regular file",
                path.display
            )));
        }
        Ok((std::fs::File::from(fd), st.st_size))
    })
    .await?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_LENGTH, size.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

async fn upload(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    Query(query): Query<CreateQuery>,
    headers: HeaderMap,
    request: Request,
) -> Result<(StatusCode, Json<EntryStat>), ContentError> {
    let root = authorise(&state, &id, &headers).await?;
    let path = VolumePath::parse(&query.path)?;
    let name = path.name_or_root()?.to_string();
    let mode = query.mode.unwrap_or(0o644) & 0o7777;
    let temp_name = format!(".{name}.berth-upload-{:016x}", rand::random::<u64>());
    // Parents are created as needed (as envd's file writes do), owned like the parent.
    let (parent, temp) = {
        let path_for_dirs = VolumePath::parse(&path.parent)?;
        let temp_name = temp_name.clone();
        let display = path.display.clone();
        let (uid, gid) = (query.uid, query.gid);
        blocking(move || {
            let fail = |e| ContentError::fs(&display, "write", e);
            let parent = if path_for_dirs.name.is_some() {
                make_dir(root.as_fd(), &path_for_dirs, true, None, None, 0o755)?;
                open_dir(root.as_fd(), &path_for_dirs.display[1..]).map_err(fail)?
            } else {
                open_dir(root.as_fd(), ".").map_err(fail)?
            };
            let (owner, group) = owner_for(parent.as_fd(), uid, gid).map_err(fail)?;
            let temp = rustix::fs::openat(
                parent.as_fd(),
                temp_name.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(fail)?;
            rustix::fs::fchown(
                &temp,
                Some(rustix::fs::Uid::from_raw(owner)),
                Some(rustix::fs::Gid::from_raw(group)),
            )
            .map_err(fail)?;
            rustix::fs::fchmod(&temp, Mode::from_raw_mode(mode)).map_err(fail)?;
            Ok((parent, temp))
        })
        .await?
    };
    let written = write_body(request.into_body(), temp, &path.display).await;
    let display = path.display.clone();
    blocking(move || {
        let fail = |e| ContentError::fs(&display, "write", e);
        if let Err(err) = written {
            let _ = rustix::fs::unlinkat(parent.as_fd(), temp_name.as_str(), AtFlags::empty());
            return Err(err);
        }
        rustix::fs::renameat(
            parent.as_fd(),
            temp_name.as_str(),
            parent.as_fd(),
            name.as_str(),
        )
        .map_err(|e| {
            let _ = rustix::fs::unlinkat(parent.as_fd(), temp_name.as_str(), AtFlags::empty());
            fail(e)
        })?;
        stat_entry(parent.as_fd(), &name, &display).map_err(fail)
    })
    .await
    .map(|stat| (StatusCode::CREATED, Json(stat)))
}

/// Streams `body` into `file`; a full volume is a 507.
async fn write_body(mut body: Body, file: OwnedFd, display: &str) -> Result<(), ContentError> {
    use tokio::io::AsyncWriteExt;
    let mut file = tokio::fs::File::from_std(std::fs::File::from(file));
    let io_fail = |e: std::io::Error| match e.raw_os_error() {
        Some(code) => ContentError::fs(display, "write", Errno::from_raw_os_error(code)),
        None => internal(format!("write {display:?}: {e}")),
    };
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| ContentError::bad_request(format!("reading the upload: {e}")))?;
        if let Ok(data) = frame.into_data() {
            file.write_all(&data).await.map_err(io_fail)?;
        }
    }
    file.flush().await.map_err(io_fail)?;
    file.sync_data().await.map_err(io_fail)
}

/// The content routes, served beside the API (outside its body buffer).
pub fn routes() -> Router<SharedState> {
    Router::new()
        .route(
            "/volumecontent/{volumeID}/path",
            get(get_path).patch(patch_path).delete(delete_path),
        )
        .route(
            "/volumecontent/{volumeID}/dir",
            get(list).post(make_directory),
        )
        .route("/volumecontent/{volumeID}/file", get(download).put(upload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_normalise_and_refuse_dot_dot() {
        let p = VolumePath::parse("a//b/./c/").unwrap();
        assert_eq!(
            (p.display.as_str(), p.parent.as_str(), p.name.as_deref()),
            ("/a/b/c", "a/b", Some("c"))
        );
        let root = VolumePath::parse("/").unwrap();
        assert_eq!((root.display.as_str(), root.name), ("/", None));
        let top = VolumePath::parse("/x").unwrap();
        assert_eq!((top.parent.as_str(), top.name.as_deref()), (".", Some("x")));
        assert!(VolumePath::parse("a/../b").is_err());
        assert!(VolumePath::parse("a\0b").is_err());
    }
}
