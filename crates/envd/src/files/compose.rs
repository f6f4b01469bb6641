//! `POST /files/compose`: concatenate source files into a destination and delete the
//! sources (how SDKs assemble chunked uploads). The data moves inside the kernel
//! (`std::io::copy` between files uses `copy_file_range`), into a temporary file next to
//! the destination that is renamed over it only when complete, so a failure never leaves
//! a half-composed destination.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::Deserialize;

use super::{blocking, defaults, ensure_dirs, request_user, HttpEntryInfo, HttpError};
use crate::state::EnvdState;
use crate::users::{resolve_path, User};

/// The request body.
#[derive(Debug, Deserialize)]
pub struct ComposeRequest {
    pub source_paths: Vec<String>,
    pub destination: String,
    #[serde(default)]
    pub username: Option<String>,
}

/// `POST /files/compose`.
pub async fn post_compose(
    State(state): State<Arc<EnvdState>>,
    headers: HeaderMap,
    body: Result<Json<ComposeRequest>, JsonRejection>,
) -> Result<Json<HttpEntryInfo>, HttpError> {
    let Json(request) =
        body.map_err(|e| HttpError::bad_request(format!("invalid request body: {e}")))?;
    if request.source_paths.is_empty() {
        return Err(HttpError::bad_request("source_paths must not be empty"));
    }
    if request.destination.is_empty() {
        return Err(HttpError::bad_request("destination is required"));
    }
    let user = request_user(&state, request.username.as_deref(), &headers)?;
    let workdir = defaults(&state).workdir;
    let destination = resolve_path(&request.destination, &user, workdir.as_deref())
        .map_err(|e| HttpError::bad_request(format!("error resolving destination path: {e}")))?;
    let mut sources = Vec::with_capacity(request.source_paths.len());
    for source in &request.source_paths {
        let resolved = resolve_path(source, &user, workdir.as_deref()).map_err(|e| {
            HttpError::bad_request(format!("error resolving source path '{source}': {e}"))
        })?;
        if resolved == destination {
            return Err(HttpError::bad_request(format!(
                "source path '{source}' cannot be the same as destination"
            )));
        }
        sources.push(resolved);
    }
    let result_path = destination.clone();
    blocking(move || compose(&sources, &destination, &user)).await?;
    Ok(Json(HttpEntryInfo::file(&result_path, None)))
}

fn compose(sources: &[PathBuf], destination: &Path, user: &User) -> Result<(), HttpError> {
    for source in sources {
        let meta = std::fs::metadata(source).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                HttpError::new(
                    StatusCode::NOT_FOUND,
                    format!("source file not found: '{}'", source.display()),
                )
            } else {
                HttpError::io("error checking source file", source, &e)
            }
        })?;
        if !meta.is_file() {
            return Err(HttpError::bad_request(format!(
                "source path '{}' is not a regular file",
                source.display()
            )));
        }
    }
    if let Some(parent) = destination.parent() {
        ensure_dirs(parent, user)?;
    }
    if destination.is_dir() {
        return Err(HttpError::bad_request(format!(
            "path '{}' is a directory",
            destination.display()
        )));
    }
    let mut temp = TempPath {
        path: temp_path_for(destination),
        armed: true,
    };
    let mut output = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp.path)
        .map_err(|e| HttpError::io("error creating destination file", destination, &e))?;
    super::chown_to(&temp.path, user)?;
    for source in sources {
        let mut input = std::fs::File::open(source)
            .map_err(|e| HttpError::io("error opening source file", source, &e))?;
        std::io::copy(&mut input, &mut output)
            .map_err(|e| HttpError::io("error composing source", source, &e))?;
    }
    drop(output);
    std::fs::rename(&temp.path, destination)
        .map_err(|e| HttpError::io("error finalizing compose into", destination, &e))?;
    temp.armed = false;
    for source in sources {
        // The result is complete; a source that vanished meanwhile changes nothing.
        let _ = std::fs::remove_file(source);
    }
    Ok(())
}

/// A unique sibling of `destination` (same filesystem, so the rename is atomic).
fn temp_path_for(destination: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut name = destination.file_name().unwrap_or_default().to_os_string();
    name.push(format!(
        ".berth-compose.{}.{}.tmp",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    destination.with_file_name(name)
}

/// Removes the temporary file unless it was renamed into place.
struct TempPath {
    path: PathBuf,
    armed: bool,
}

impl Drop for TempPath {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use serde_json::json;

    use super::super::test_http::json;
    use super::super::test_support::Sandbox;
    use super::*;

    fn compose_request(body: serde_json::Value) -> Request<Body> {
        Request::post("/files/compose")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    }

    #[tokio::test]
    async fn concatenates_in_order_and_deletes_sources() {
        let sb = Sandbox::new("compose-ok");
        std::fs::write(sb.path("p1"), b"hello ").unwrap();
        std::fs::write(sb.path("p2"), b"big ").unwrap();
        std::fs::write(sb.path("p3"), b"world").unwrap();
        std::fs::write(sb.path("out.txt"), b"old content to replace").unwrap();
        let got = json(
            &sb,
            compose_request(
                json!({"source_paths": ["p1", "p2", "~/p3"], "destination": "out.txt"}),
            ),
            StatusCode::OK,
        )
        .await;
        assert_eq!(
            got,
            json!({"path": sb.path("out.txt").to_str().unwrap(), "name": "out.txt", "type": "file"})
        );
        assert_eq!(
            std::fs::read(sb.path("out.txt")).unwrap(),
            b"hello big world"
        );
        for p in ["p1", "p2", "p3"] {
            assert!(!sb.path(p).exists());
        }
        // Only the destination is left: no temporary file.
        assert_eq!(std::fs::read_dir(sb.home()).unwrap().count(), 1);
    }

    #[tokio::test]
    async fn compose_errors() {
        let sb = Sandbox::new("compose-err");
        std::fs::write(sb.path("p1"), b"x").unwrap();
        let err = json(
            &sb,
            compose_request(json!({"source_paths": ["p1", "nope"], "destination": "d"})),
            StatusCode::NOT_FOUND,
        )
        .await;
        assert!(err["message"].as_str().unwrap().contains("nope"), "{err}");
        assert!(sb.path("p1").exists(), "sources stay when compose fails");
        assert!(!sb.path("d").exists());
        json(
            &sb,
            compose_request(json!({"source_paths": ["p1"], "destination": "p1"})),
            StatusCode::BAD_REQUEST,
        )
        .await;
        json(
            &sb,
            compose_request(json!({"source_paths": [], "destination": "d"})),
            StatusCode::BAD_REQUEST,
        )
        .await;
        json(
            &sb,
            compose_request(json!({"destination": "d"})),
            StatusCode::BAD_REQUEST,
        )
        .await;
        std::fs::create_dir(sb.path("dir")).unwrap();
        json(
            &sb,
            compose_request(json!({"source_paths": ["dir"], "destination": "d"})),
            StatusCode::BAD_REQUEST,
        )
        .await;
    }
}
