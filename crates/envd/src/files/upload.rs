//! `POST /files`: upload one file (`application/octet-stream` with `path`) or several
//! (`multipart/form-data`, parts named `file`; without `path` each part's filename is its
//! path), optionally gzip-compressed (`Content-Encoding: gzip`).
//!
//! Bodies are streamed: each chunk goes through a bounded channel to a blocking writer
//! thread as it arrives, so memory stays at a few chunks whatever the file size. The file
//! is written in place (open with truncate), like E2B's envd: the inode, its hard links
//! and its mode survive, and watchers see the file's own name being written. Missing
//! parent directories are created; new directories and the file are owned by the request's
//! user when envd runs as root. `X-Metadata-*` headers replace the file's metadata.
//!
//! An upload that fails before its body ends (a full disk, a read-only path) is answered
//! at once while the rest of the body is read and discarded in the background
//! ([`drain_when_abandoned`]): hyper closes a connection whose request body was not read
//! to the end, and closing a socket with unread data resets it, so the client, or the
//! sandbox proxy still forwarding the body, would see a reset instead of the answer.
//!
//! The multipart parsing is separate from the disk ([`read_multipart`] over any byte
//! stream into any [`PartSink`]) so it can be fuzzed without touching the filesystem.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use async_compression::tokio::bufread::GzipDecoder;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap};
use axum::Json;
use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use tokio_util::io::{ReaderStream, StreamReader};

use super::{
    blocking, defaults, ensure_dirs, metadata, request_user, FilesQuery, HttpEntryInfo, HttpError,
};
use crate::auth::FileOperation;
use crate::state::EnvdState;
use crate::users::{resolve_path, User};

/// A request body (or one multipart part), chunk by chunk.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, HttpError>> + Send>>;

/// Chunks queued between the network and the writer thread (bounds memory per upload).
const WRITE_QUEUE_CHUNKS: usize = 16;
/// Read size when decompressing a gzip body.
const DECODE_CHUNK_BYTES: usize = 256 * 1024;

/// `POST /files`.
pub async fn post_files(
    State(state): State<Arc<EnvdState>>,
    query: Result<Query<FilesQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Vec<HttpEntryInfo>>, HttpError> {
    let Query(query) = query.map_err(|e| HttpError::bad_request(format!("invalid query: {e}")))?;
    super::authorize(&state, &query, &headers, FileOperation::Write)?;
    let metadata = metadata::from_headers(&headers)?;
    let user = request_user(&state, query.username.as_deref(), &headers)?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media_type = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let body = decoded_body(&headers, drain_when_abandoned(body))?;
    let ctx = UploadContext {
        user,
        default_workdir: defaults(&state).workdir,
        query_path: query.path,
        metadata,
    };
    let entries = if media_type == "application/octet-stream" {
        let path = ctx.query_path.as_deref().ok_or_else(|| {
            HttpError::bad_request("path query parameter is required for raw body upload")
        })?;
        let target = ctx.resolve(path)?;
        write_file(&target, body, &ctx.user, &ctx.metadata).await?;
        vec![ctx.entry(&target)]
    } else if media_type.starts_with("multipart/") {
        let boundary = multer::parse_boundary(content_type).map_err(|e| {
            HttpError::bad_request(format!(
                "invalid Content-Type '{content_type}' for a multipart upload: {e}"
            ))
        })?;
        let mut sink = DiskSink {
            ctx: &ctx,
            written: Vec::new(),
        };
        read_multipart(body, &boundary, &mut sink).await?;
        if sink.written.is_empty() {
            return Err(HttpError::bad_request(
                "the multipart body has no part named 'file'",
            ));
        }
        sink.written.iter().map(|p| ctx.entry(p)).collect()
    } else {
        return Err(HttpError::bad_request(format!(
            "unsupported content type: '{content_type}', expected multipart/form-data or application/octet-stream"
        )));
    };
    Ok(Json(entries))
}

/// `body`, read by a task of its own that keeps reading (and discarding) it to the end
/// once the returned body is dropped early.
pub fn drain_when_abandoned(body: Body) -> Body {
    let (chunks_tx, chunks_rx) = tokio::sync::mpsc::channel(2);
    tokio::spawn(async move {
        let mut raw = body.into_data_stream();
        let mut forwarding = true;
        while let Some(chunk) = raw.next().await {
            if forwarding && chunks_tx.send(chunk).await.is_err() {
                forwarding = false;
            }
        }
    });
    let mut chunks_rx = chunks_rx;
    Body::from_stream(futures::stream::poll_fn(move |cx| chunks_rx.poll_recv(cx)))
}

/// The request body, gunzipped when `Content-Encoding: gzip`.
pub fn decoded_body(headers: &HeaderMap, body: Body) -> Result<ByteStream, HttpError> {
    let raw = body
        .into_data_stream()
        .map_err(|e| HttpError::bad_request(format!("error reading request body: {e}")));
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let Some(encoding) = encoding else {
        return Ok(Box::pin(raw));
    };
    let name = encoding
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match name.as_str() {
        "" | "identity" => Ok(Box::pin(raw)),
        "gzip" | "x-gzip" => Ok(gunzip(raw)),
        _ => Err(HttpError::bad_request(format!(
            "unsupported Content-Encoding: {encoding}, supported: [gzip]"
        ))),
    }
}

/// Decompresses a gzip byte stream (concatenated members too, as gzip tools write them).
pub fn gunzip(
    compressed: impl Stream<Item = Result<Bytes, HttpError>> + Send + 'static,
) -> ByteStream {
    let reader = StreamReader::new(compressed.map_err(|e| io::Error::other(e.message)));
    let mut decoder = GzipDecoder::new(reader);
    decoder.multiple_members(true);
    Box::pin(
        ReaderStream::with_capacity(decoder, DECODE_CHUNK_BYTES).map_err(|e| {
            HttpError::bad_request(format!("error decompressing gzip request body: {e}"))
        }),
    )
}

/// Who uploads, where relative names go, and the metadata every file gets.
pub struct UploadContext {
    pub user: User,
    pub default_workdir: Option<String>,
    /// The `path` query parameter; for multipart it overrides part filenames.
    pub query_path: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

impl UploadContext {
    fn resolve(&self, path: &str) -> Result<PathBuf, HttpError> {
        resolve_path(path, &self.user, self.default_workdir.as_deref())
            .map_err(|e| HttpError::bad_request(format!("error resolving path: {e}")))
    }

    fn entry(&self, path: &Path) -> HttpEntryInfo {
        let metadata = (!self.metadata.is_empty()).then(|| self.metadata.clone());
        HttpEntryInfo::file(path, metadata)
    }
}

/// Receives the `file` parts of a multipart upload, in order.
pub trait PartSink {
    /// `file_name` is the part's `filename` exactly as sent (not sanitized); `content`
    /// must be drained (or the upload fails) before the next part can be read.
    fn accept<'a>(
        &'a mut self,
        file_name: Option<String>,
        content: ByteStream,
    ) -> impl Future<Output = Result<(), HttpError>> + Send + 'a;
}

/// Parses a `multipart/form-data` body with `boundary`, handing every part named `file`
/// to `sink` and skipping the others. Malformed input is a 400, never a panic.
pub async fn read_multipart<S, K>(body: S, boundary: &str, sink: &mut K) -> Result<(), HttpError>
where
    S: Stream<Item = Result<Bytes, HttpError>> + Send + 'static,
    K: PartSink,
{
    let mut multipart = multer::Multipart::new(body, boundary);
    while let Some(field) = multipart.next_field().await.map_err(multipart_error)? {
        // Other fields are skipped by the next `next_field`.
        if field.name() != Some("file") {
            continue;
        }
        let file_name = field.file_name().map(str::to_owned);
        sink.accept(file_name, Box::pin(field.map_err(multipart_error)))
            .await?;
    }
    Ok(())
}

fn multipart_error(err: multer::Error) -> HttpError {
    HttpError::bad_request(format!("error reading multipart form: {err}"))
}

/// Writes each part to the path its filename (or the `path` parameter) names.
struct DiskSink<'c> {
    ctx: &'c UploadContext,
    written: Vec<PathBuf>,
}

impl PartSink for DiskSink<'_> {
    async fn accept(
        &mut self,
        file_name: Option<String>,
        content: ByteStream,
    ) -> Result<(), HttpError> {
        let name =
            match (&self.ctx.query_path, file_name) {
                (Some(path), _) => path.clone(),
                (None, Some(file_name)) if !file_name.is_empty() => file_name,
                (None, _) => return Err(HttpError::bad_request(
                    "multipart part 'file' has no filename and no path query parameter was given",
                )),
            };
        let target = self.ctx.resolve(&name)?;
        if self.written.contains(&target) {
            return Err(HttpError::bad_request(format!(
                "you cannot upload multiple files to the same path '{}' in one upload request",
                target.display()
            )));
        }
        write_file(&target, content, &self.ctx.user, &self.ctx.metadata).await?;
        self.written.push(target);
        Ok(())
    }
}

/// Streams `content` into `target` (created or truncated), then sets its metadata.
pub async fn write_file(
    target: &Path,
    mut content: ByteStream,
    user: &User,
    metadata: &BTreeMap<String, String>,
) -> Result<(), HttpError> {
    let file = {
        let (target, user) = (target.to_owned(), user.clone());
        blocking(move || open_for_upload(&target, &user)).await?
    };
    let (chunks_tx, mut chunks_rx) = tokio::sync::mpsc::channel::<Bytes>(WRITE_QUEUE_CHUNKS);
    let writer = {
        let (target, metadata) = (target.to_owned(), metadata.clone());
        tokio::task::spawn_blocking(move || -> Result<(), HttpError> {
            let mut file = file;
            while let Some(chunk) = chunks_rx.blocking_recv() {
                file.write_all(&chunk)
                    .map_err(|e| HttpError::io("error writing file", &target, &e))?;
            }
            metadata::replace_on_fd(&file, &target, &metadata)
        })
    };
    let mut read_error = None;
    while let Some(chunk) = content.next().await {
        match chunk {
            // A closed channel means the writer failed; its error is reported below.
            Ok(chunk) => {
                if chunks_tx.send(chunk).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                read_error = Some(e);
                break;
            }
        }
    }
    drop(chunks_tx);
    let written = writer
        .await
        .map_err(|e| HttpError::internal(format!("file writer failed: {e}")))?;
    match read_error {
        Some(e) => Err(e),
        None => written,
    }
}

/// Creates the parents, refuses directories, opens `target` truncated and gives it to
/// `user` (as E2B does, also when it already existed).
fn open_for_upload(target: &Path, user: &User) -> Result<std::fs::File, HttpError> {
    if let Some(parent) = target.parent() {
        ensure_dirs(parent, user)?;
    }
    match std::fs::metadata(target) {
        Ok(meta) if meta.is_dir() => {
            return Err(HttpError::bad_request(format!(
                "path '{}' is a directory",
                target.display()
            )))
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(HttpError::io("error checking file", target, &e)),
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o666)
        .open(target)
        .map_err(|e| HttpError::io("error opening file", target, &e))?;
    if rustix::process::geteuid().is_root() {
        // On the open file: a symlinked target's file gets the owner, not the link.
        rustix::fs::fchown(
            &file,
            Some(rustix::fs::Uid::from_raw(user.uid)),
            Some(rustix::fs::Gid::from_raw(user.gid)),
        )
        .map_err(|e| HttpError::io("error changing ownership of", target, &e.into()))?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt;

    use axum::http::{Request, StatusCode};
    use serde_json::json;

    use super::super::test_http::json;
    use super::super::test_support::Sandbox;
    use super::*;
    use crate::auth::file_signature;

    fn octet(uri: &str, body: impl Into<Body>) -> Request<Body> {
        Request::post(uri)
            .header("content-type", "application/octet-stream")
            .body(body.into())
            .unwrap()
    }

    const BOUNDARY: &str = "XbOuNdArYx";

    /// A multipart body of `(field name, filename, content)` parts.
    fn multipart_body(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for (name, file_name, content) in parts {
            write!(
                body,
                "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\""
            )
            .unwrap();
            if let Some(file_name) = file_name {
                write!(body, "; filename=\"{file_name}\"").unwrap();
            }
            body.extend_from_slice(b"\r\nContent-Type: application/octet-stream\r\n\r\n");
            body.extend_from_slice(content);
            body.extend_from_slice(b"\r\n");
        }
        write!(body, "--{BOUNDARY}--\r\n").unwrap();
        body
    }

    fn multipart(uri: &str, body: Vec<u8>) -> Request<Body> {
        Request::post(uri)
            .header(
                "content-type",
                format!("multipart/form-data; boundary={BOUNDARY}"),
            )
            .body(Body::from(body))
            .unwrap()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    #[tokio::test]
    async fn octet_stream_upload_creates_parents() {
        let sb = Sandbox::new("up-octet");
        let got = json(
            &sb,
            octet("/files?path=dir/sub/a.txt", "hello"),
            StatusCode::OK,
        )
        .await;
        let path = sb.path("dir/sub/a.txt");
        assert_eq!(
            got,
            json!([{"path": path.to_str().unwrap(), "name": "a.txt", "type": "file"}])
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"hello");
        let dir_mode = std::fs::metadata(sb.path("dir"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o755);
    }

    #[tokio::test]
    async fn overwrite_truncates_and_keeps_inode_and_mode() {
        let sb = Sandbox::new("up-overwrite");
        let path = sb.path("f.txt");
        std::fs::write(&path, b"a much longer old content").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
        json(&sb, octet("/files?path=~/f.txt", "new"), StatusCode::OK).await;
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert_eq!(std::os::unix::fs::MetadataExt::ino(&meta), inode);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    #[tokio::test]
    async fn multipart_uses_filenames_as_paths_and_skips_other_fields() {
        let sb = Sandbox::new("up-multi");
        let abs = sb.path("abs/b.bin");
        let body = multipart_body(&[
            ("file", Some("rel/a.txt"), b"AAA"),
            ("note", None, b"ignored"),
            ("file", Some(abs.to_str().unwrap()), b"\x00\x01\x02"),
        ]);
        let got = json(&sb, multipart("/files", body), StatusCode::OK).await;
        assert_eq!(got.as_array().unwrap().len(), 2);
        assert_eq!(got[0]["path"], sb.path("rel/a.txt").to_str().unwrap());
        assert_eq!(got[1]["path"], abs.to_str().unwrap());
        assert_eq!(got[1]["name"], "b.bin");
        assert_eq!(std::fs::read(sb.path("rel/a.txt")).unwrap(), b"AAA");
        assert_eq!(std::fs::read(&abs).unwrap(), b"\x00\x01\x02");
    }

    #[tokio::test]
    async fn multipart_path_parameter_overrides_filename() {
        let sb = Sandbox::new("up-multi-path");
        let body = multipart_body(&[("file", Some("ignored.txt"), b"x")]);
        json(
            &sb,
            multipart("/files?path=chosen.txt", body),
            StatusCode::OK,
        )
        .await;
        assert!(sb.path("chosen.txt").exists());
        assert!(!sb.path("ignored.txt").exists());
        // Two parts to the one `path`: the second is refused.
        let body = multipart_body(&[("file", Some("a"), b"1"), ("file", Some("b"), b"2")]);
        let err = json(
            &sb,
            multipart("/files?path=same.txt", body),
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert!(err["message"]
            .as_str()
            .unwrap()
            .contains("multiple files to the same path"));
    }

    #[tokio::test]
    async fn gzip_bodies_are_decompressed() {
        let sb = Sandbox::new("up-gzip");
        let data: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let mut request = octet("/files?path=big.bin", gzip(&data));
        request
            .headers_mut()
            .insert("content-encoding", "gzip".parse().unwrap());
        json(&sb, request, StatusCode::OK).await;
        assert_eq!(std::fs::read(sb.path("big.bin")).unwrap(), data);

        let mut corrupt = octet("/files?path=bad.bin", &b"not gzip at all"[..]);
        corrupt
            .headers_mut()
            .insert("content-encoding", "gzip".parse().unwrap());
        let err = json(&sb, corrupt, StatusCode::BAD_REQUEST).await;
        assert!(err["message"].as_str().unwrap().contains("gzip"), "{err}");

        let mut brotli = octet("/files?path=x", "x");
        brotli
            .headers_mut()
            .insert("content-encoding", "br".parse().unwrap());
        let err = json(&sb, brotli, StatusCode::BAD_REQUEST).await;
        assert_eq!(err["code"], 400);
        assert!(err["message"]
            .as_str()
            .unwrap()
            .contains("unsupported Content-Encoding: br"));
    }

    #[tokio::test]
    async fn metadata_headers_replace_xattrs() {
        let sb = Sandbox::new("up-metadata");
        let mut request = octet("/files?path=m.txt", "x");
        request
            .headers_mut()
            .insert("X-Metadata-Owner", "alice".parse().unwrap());
        request
            .headers_mut()
            .insert("X-Metadata-Kind", "report".parse().unwrap());
        let got = json(&sb, request, StatusCode::OK).await;
        assert_eq!(
            got[0]["metadata"],
            json!({"owner": "alice", "kind": "report"})
        );
        let stored = metadata::read(&sb.path("m.txt")).unwrap();
        assert_eq!(stored.len(), 2);
        assert_eq!(stored["owner"], "alice");
        // An upload without metadata clears it.
        let got = json(&sb, octet("/files?path=m.txt", "y"), StatusCode::OK).await;
        assert!(got[0].get("metadata").is_none());
        assert!(metadata::read(&sb.path("m.txt")).unwrap().is_empty());
        // Invalid metadata is refused before anything is written.
        let mut bad = octet("/files?path=never.txt", "z");
        bad.headers_mut().insert(
            "X-Metadata-Name",
            axum::http::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        json(&sb, bad, StatusCode::BAD_REQUEST).await;
        assert!(!sb.path("never.txt").exists());
    }

    #[tokio::test]
    async fn bad_requests_get_clear_errors() {
        let sb = Sandbox::new("up-errors");
        std::fs::create_dir(sb.path("adir")).unwrap();
        let err = json(&sb, octet("/files?path=adir", "x"), StatusCode::BAD_REQUEST).await;
        assert_eq!(
            err,
            json!({"code": 400, "message": format!("path '{}' is a directory", sb.path("adir").display())})
        );
        let err = json(&sb, octet("/files", "x"), StatusCode::BAD_REQUEST).await;
        assert!(err["message"]
            .as_str()
            .unwrap()
            .contains("path query parameter is required"));
        let text = Request::post("/files?path=a")
            .header("content-type", "text/plain")
            .body(Body::from("x"))
            .unwrap();
        let err = json(&sb, text, StatusCode::BAD_REQUEST).await;
        assert!(err["message"]
            .as_str()
            .unwrap()
            .contains("unsupported content type"));
        let err = json(
            &sb,
            octet("/files?path=a&username=ghost", "x"),
            StatusCode::UNAUTHORIZED,
        )
        .await;
        assert!(err["message"].as_str().unwrap().contains("'ghost'"));
        let err = json(
            &sb,
            octet("/files?path=~ghost/a", "x"),
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert!(err["message"].as_str().unwrap().contains("~ghost/a"));
        std::fs::write(sb.path("plain"), b"").unwrap();
        let err = json(
            &sb,
            octet("/files?path=plain/child", "x"),
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert!(err["message"]
            .as_str()
            .unwrap()
            .contains("is not a directory"));
        let garbage = multipart("/files", b"--nope\r\ngarbage".to_vec());
        let err = json(&sb, garbage, StatusCode::BAD_REQUEST).await;
        assert!(
            err["message"].as_str().unwrap().contains("multipart"),
            "{err}"
        );
        let no_file = multipart("/files", multipart_body(&[("other", Some("o"), b"x")]));
        let err = json(&sb, no_file, StatusCode::BAD_REQUEST).await;
        assert!(err["message"]
            .as_str()
            .unwrap()
            .contains("no part named 'file'"));
        let no_name = multipart("/files", multipart_body(&[("file", None, b"x")]));
        let err = json(&sb, no_name, StatusCode::BAD_REQUEST).await;
        assert!(err["message"].as_str().unwrap().contains("no filename"));
    }

    #[tokio::test]
    async fn token_or_signature_required_once_a_token_is_set() {
        let sb = Sandbox::new("up-auth");
        sb.state.defaults.write().unwrap().access_token = Some("tok".into());
        let err = json(
            &sb,
            octet("/files?path=s.txt", "x"),
            StatusCode::UNAUTHORIZED,
        )
        .await;
        assert_eq!(err["message"], "missing signature query parameter");
        let mut with_token = octet("/files?path=s.txt", "x");
        with_token
            .headers_mut()
            .insert("x-access-token", "tok".parse().unwrap());
        json(&sb, with_token, StatusCode::OK).await;
        let sig = file_signature("s.txt", FileOperation::Write, "", "tok", Some(i64::MAX / 2));
        let uri = format!(
            "/files?path=s.txt&signature={}&signature_expiration={}",
            sig.replace('+', "%2B").replace('/', "%2F"),
            i64::MAX / 2
        );
        json(&sb, octet(&uri, "signed"), StatusCode::OK).await;
        assert_eq!(std::fs::read(sb.path("s.txt")).unwrap(), b"signed");
        let read_sig = file_signature("s.txt", FileOperation::Read, "", "tok", None);
        let uri = format!(
            "/files?path=s.txt&signature={}",
            read_sig.replace('+', "%2B").replace('/', "%2F")
        );
        json(&sb, octet(&uri, "x"), StatusCode::UNAUTHORIZED).await;
        let expired = file_signature("s.txt", FileOperation::Write, "", "tok", Some(1));
        let uri = format!(
            "/files?path=s.txt&signature={}&signature_expiration=1",
            expired.replace('+', "%2B").replace('/', "%2F")
        );
        let err = json(&sb, octet(&uri, "x"), StatusCode::UNAUTHORIZED).await;
        assert_eq!(err["message"], "signature is already expired");
        let err = json(
            &sb,
            octet(
                "/files?path=s.txt&signature=v1_x&signature_expiration=soon",
                "x",
            ),
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert!(err["message"]
            .as_str()
            .unwrap()
            .contains("signature_expiration"));
    }

    /// The file grows on disk while the body is still arriving: nothing is buffered
    /// until the end.
    #[tokio::test]
    async fn upload_is_written_while_streaming() {
        use tower::ServiceExt;
        let sb = Sandbox::new("up-stream");
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let body = Body::from_stream(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)));
        let request = octet("/files?path=stream.bin", body);
        let app = super::super::router().with_state(sb.state.clone());
        let upload = tokio::spawn(app.oneshot(request));
        let path = sb.path("stream.bin");
        const MIB: u64 = 1 << 20;
        let chunk = Bytes::from(vec![7u8; MIB as usize]);
        for sent in 1..=8u64 {
            tx.send(Ok(chunk.clone())).await.unwrap();
            // Bounded wait so a regression fails instead of hanging; not a timing assertion.
            let mut waited = 0;
            while std::fs::metadata(&path).map_or(0, |m| m.len()) < sent * MIB {
                assert!(waited < 6000, "chunk {sent} never reached the disk");
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                waited += 1;
            }
        }
        drop(tx);
        let response = upload.await.unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 * MIB);
    }
}
