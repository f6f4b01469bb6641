//! `GET /files?path=&username=`: stream a file, gzip-compressed when `Accept-Encoding`
//! prefers it, or one byte range of it (`Range: bytes=…`, answered 206 uncompressed, as
//! Go's `http.ServeContent` in E2B's envd does). A blocking thread reads 256 KiB chunks into a small channel, so a slow
//! client holds back the reader instead of filling memory, and a gone client stops it.

use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_compression::tokio::bufread::GzipEncoder;
use async_compression::Level;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::Stream;
use tokio_util::io::{ReaderStream, StreamReader};

use super::{authorize, blocking, defaults, request_user, FilesQuery, HttpError};
use crate::auth::FileOperation;
use crate::state::EnvdState;
use crate::users::resolve_path;

/// Bytes per read from the file.
const READ_CHUNK_BYTES: u64 = 256 * 1024;
/// Chunks read ahead of the network.
const READ_AHEAD_CHUNKS: usize = 4;

/// How the response body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseEncoding {
    Identity,
    Gzip,
}

/// Picks the encoding per `Accept-Encoding` (RFC 9110 §12.5.3, E2B's rules): the
/// highest-quality acceptable of identity and gzip; identity is acceptable unless
/// refused with `q=0`; `*` means gzip only when identity is refused. `Err` (406) when
/// nothing we support is acceptable.
pub fn negotiate_encoding(accept_encoding: Option<&str>) -> Result<ResponseEncoding, HttpError> {
    let Some(header) = accept_encoding.filter(|h| !h.trim().is_empty()) else {
        return Ok(ResponseEncoding::Identity);
    };
    let mut offers: Vec<(String, f64)> = header
        .split(',')
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let quality = parts
                .filter_map(|p| {
                    let p = p.trim();
                    p.strip_prefix("q=")
                        .or_else(|| p.strip_prefix("Q="))
                        .and_then(|q| q.trim().parse::<f64>().ok())
                })
                .next_back()
                .unwrap_or(1.0);
            (name, quality)
        })
        .filter(|(name, _)| !name.is_empty())
        .collect();
    // Stable: equal qualities keep the client's order.
    offers.sort_by(|a, b| b.1.total_cmp(&a.1));
    let identity_refused = offers.iter().any(|(n, q)| n == "identity" && *q == 0.0);
    for (name, quality) in &offers {
        if *quality <= 0.0 {
            continue;
        }
        match name.as_str() {
            "identity" => return Ok(ResponseEncoding::Identity),
            "gzip" | "x-gzip" => return Ok(ResponseEncoding::Gzip),
            "*" if identity_refused => return Ok(ResponseEncoding::Gzip),
            "*" => return Ok(ResponseEncoding::Identity),
            _ => {}
        }
    }
    if identity_refused {
        Err(HttpError::new(
            StatusCode::NOT_ACCEPTABLE,
            format!("no acceptable encoding found in Accept-Encoding '{header}', supported: [identity, gzip]"),
        ))
    } else {
        Ok(ResponseEncoding::Identity)
    }
}

/// Largest download answered with gzip when the client asks for it; see `get_file`.
const GZIP_MAX_BYTES: u64 = 1 << 20;

/// Whether the request accepts an uncompressed answer.
fn identity_acceptable(headers: &HeaderMap) -> bool {
    !refuses_identity(
        headers
            .get(header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    )
}

/// `Accept-Encoding` refuses identity explicitly (`identity;q=0`, or `*;q=0` without an
/// identity entry).
fn refuses_identity(accept_encoding: Option<&str>) -> bool {
    let Some(header) = accept_encoding else {
        return false;
    };
    let mut identity = None;
    let mut star = None;
    for item in header.split(',') {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let zero = parts.any(|p| {
            p.trim()
                .strip_prefix("q=")
                .is_some_and(|q| q.trim().parse::<f64>().is_ok_and(|q| q == 0.0))
        });
        match name.as_str() {
            "identity" => identity = Some(zero),
            "*" => star = Some(zero),
            _ => {}
        }
    }
    identity.unwrap_or(star.unwrap_or(false))
}

/// `GET /files`.
pub async fn get_file(
    State(state): State<Arc<EnvdState>>,
    query: Result<Query<FilesQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let Query(query) = query.map_err(|e| HttpError::bad_request(format!("invalid query: {e}")))?;
    authorize(&state, &query, &headers, FileOperation::Read)?;
    let user = request_user(&state, query.username.as_deref(), &headers)?;
    let raw_path = query.path.as_deref().unwrap_or("");
    let path = resolve_path(raw_path, &user, defaults(&state).workdir.as_deref()).map_err(|e| {
        HttpError::bad_request(format!(
            "error expanding and resolving path '{raw_path}': {e}"
        ))
    })?;
    let encoding = negotiate_encoding(
        headers
            .get(header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    )?;
    let (file, size) = {
        let path = path.clone();
        blocking(move || open_for_download(&path)).await?
    };
    let range = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        Some(range) => match parse_range(range, size) {
            RangeRequest::Satisfiable(range) => Some(range),
            RangeRequest::Ignored => None,
            RangeRequest::Unsatisfiable => {
                let mut response = HttpError::new(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    format!(
                        "range '{range}' is outside '{}' ({size} bytes)",
                        path.display()
                    ),
                )
                .into_response();
                response.headers_mut().insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&format!("bytes */{size}")).expect("ASCII"),
                );
                return Ok(response);
            }
        },
        None => None,
    };
    // A range is served as is: compressing it would change what the offsets mean. A
    // large file is too: gzip, even at its fastest, runs at a few hundred MiB/s on one
    // core, far below what berth's own links carry, so for big bodies it only costs
    // (identity is always acceptable to a client that did not refuse it).
    let encoding = if range.is_some() || (size > GZIP_MAX_BYTES && identity_acceptable(&headers)) {
        ResponseEncoding::Identity
    } else {
        encoding
    };
    let (start, len) = range.map_or((0, size), |r| (r.start, r.end - r.start + 1));
    let chunks = read_chunks(file, path, start, len);
    let mut response = match encoding {
        ResponseEncoding::Identity => {
            let mut response = Response::new(Body::from_stream(chunks));
            response
                .headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
            if let Some(range) = range {
                *response.status_mut() = StatusCode::PARTIAL_CONTENT;
                response.headers_mut().insert(
                    header::CONTENT_RANGE,
                    HeaderValue::from_str(&format!("bytes {}-{}/{size}", range.start, range.end))
                        .expect("ASCII"),
                );
            }
            response
        }
        ResponseEncoding::Gzip => {
            // Fastest level: the point is fewer bytes on the wire without making the
            // CPU the bottleneck of a large download.
            let encoder = GzipEncoder::with_quality(StreamReader::new(chunks), Level::Fastest);
            let mut response = Response::new(Body::from_stream(ReaderStream::with_capacity(
                encoder,
                READ_CHUNK_BYTES as usize,
            )));
            response
                .headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            response
        }
    };
    let response_headers = response.headers_mut();
    response_headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    response_headers.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    response_headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    Ok(response)
}

/// An inclusive byte range within the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

/// What a `Range` header asks of a file of some size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeRequest {
    Satisfiable(ByteRange),
    /// Malformed, several ranges, or another unit: served whole (RFC 9110 allows it).
    Ignored,
    /// No byte of it is in the file: 416.
    Unsatisfiable,
}

/// Parses a single-range `Range: bytes=a-b | a- | -n` header against `size`.
pub fn parse_range(header: &str, size: u64) -> RangeRequest {
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return RangeRequest::Ignored;
    };
    if spec.contains(',') {
        return RangeRequest::Ignored;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return RangeRequest::Ignored;
    };
    let (first, last) = (first.trim(), last.trim());
    let parse = |text: &str| text.parse::<u64>().ok();
    let (start, end) = match (first.is_empty(), last.is_empty()) {
        // Suffix: the last n bytes.
        (true, false) => match parse(last) {
            Some(0) => return RangeRequest::Unsatisfiable,
            Some(n) => (size.saturating_sub(n), size.saturating_sub(1)),
            None => return RangeRequest::Ignored,
        },
        (false, true) => match parse(first) {
            Some(start) => (start, size.saturating_sub(1)),
            None => return RangeRequest::Ignored,
        },
        (false, false) => match (parse(first), parse(last)) {
            (Some(start), Some(end)) if start <= end => (start, end.min(size.saturating_sub(1))),
            _ => return RangeRequest::Ignored,
        },
        (true, true) => return RangeRequest::Ignored,
    };
    if size == 0 || start >= size {
        return RangeRequest::Unsatisfiable;
    }
    RangeRequest::Satisfiable(ByteRange { start, end })
}

fn open_for_download(path: &Path) -> Result<(std::fs::File, u64), HttpError> {
    let meta = std::fs::metadata(path).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            HttpError::new(
                StatusCode::NOT_FOUND,
                format!("path '{}' does not exist", path.display()),
            )
        } else {
            HttpError::io("error checking if path exists", path, &e)
        }
    })?;
    if meta.is_dir() {
        return Err(HttpError::bad_request(format!(
            "path '{}' is a directory",
            path.display()
        )));
    }
    let file =
        std::fs::File::open(path).map_err(|e| HttpError::io("error opening file", path, &e))?;
    Ok((file, meta.len()))
}

/// `len` bytes of the file from `start`, read by a blocking thread. A read error ends
/// the stream with it (the client sees a truncated body, the status being already sent).
fn read_chunks(
    file: std::fs::File,
    path: PathBuf,
    start: u64,
    len: u64,
) -> impl Stream<Item = io::Result<Bytes>> {
    let (chunks_tx, mut chunks_rx) = tokio::sync::mpsc::channel(READ_AHEAD_CHUNKS);
    tokio::task::spawn_blocking(move || {
        let mut file = file;
        let mut remaining = len;
        if start > 0 {
            if let Err(e) = file.seek(SeekFrom::Start(start)) {
                let _ = chunks_tx.blocking_send(Err(e));
                return;
            }
        }
        while remaining > 0 {
            let mut chunk = Vec::with_capacity(READ_CHUNK_BYTES.min(remaining) as usize);
            let result = (&mut file)
                .take(READ_CHUNK_BYTES.min(remaining))
                .read_to_end(&mut chunk);
            let item = match result {
                // The file shrank while being sent.
                Ok(0) => break,
                Ok(n) => {
                    remaining -= n as u64;
                    Ok(Bytes::from(chunk))
                }
                Err(e) => Err(io::Error::new(
                    e.kind(),
                    format!("error reading '{}': {e}", path.display()),
                )),
            };
            let failed = item.is_err();
            // A closed channel: the client went away.
            if chunks_tx.blocking_send(item).is_err() || failed {
                break;
            }
        }
    });
    futures::stream::poll_fn(move |cx| chunks_rx.poll_recv(cx))
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use axum::http::Request;

    use super::super::test_http::{body_bytes, json, send};
    use super::super::test_support::Sandbox;
    use super::*;
    use crate::auth::file_signature;

    fn get(uri: &str) -> Request<Body> {
        Request::get(uri).body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn large_files_are_sent_uncompressed_unless_identity_is_refused() {
        let sb = Sandbox::new("down-large");
        std::fs::write(sb.path("big"), vec![b'a'; (GZIP_MAX_BYTES + 1) as usize]).unwrap();
        for (accept, compressed) in [("gzip", false), ("gzip, identity;q=0", true)] {
            let mut request = get("/files?path=big");
            request
                .headers_mut()
                .insert("accept-encoding", accept.parse().unwrap());
            let response = send(&sb, request).await;
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(
                response.headers().get(header::CONTENT_ENCODING).is_some(),
                compressed,
                "{accept}"
            );
        }
        assert!(refuses_identity(Some("*;q=0")));
        assert!(!refuses_identity(Some("*;q=0, identity")));
        assert!(!refuses_identity(None));
    }

    #[tokio::test]
    async fn downloads_plain_and_gzip() {
        let sb = Sandbox::new("down-ok");
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(sb.path("d.bin"), &data).unwrap();
        let response = send(&sb, get("/files?path=d.bin")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-length"], "1000000");
        assert!(response.headers().get("content-encoding").is_none());
        assert_eq!(body_bytes(response).await, data);

        let mut request = get("/files?path=~/d.bin");
        request
            .headers_mut()
            .insert("accept-encoding", "gzip".parse().unwrap());
        let response = send(&sb, request).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-encoding"], "gzip");
        let compressed = body_bytes(response).await;
        assert!(compressed.len() < data.len());
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&compressed[..])
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(plain, data);

        std::fs::write(sb.path("empty"), b"").unwrap();
        let response = send(&sb, get("/files?path=empty")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(body_bytes(response).await.is_empty());
    }

    #[test]
    fn parses_single_ranges() {
        use RangeRequest::*;
        let r = |start, end| Satisfiable(ByteRange { start, end });
        assert_eq!(parse_range("bytes=0-9", 100), r(0, 9));
        assert_eq!(parse_range("bytes=90-", 100), r(90, 99));
        assert_eq!(parse_range("bytes=-10", 100), r(90, 99));
        assert_eq!(parse_range("bytes=-1000", 100), r(0, 99));
        assert_eq!(parse_range("bytes=50-1000", 100), r(50, 99));
        assert_eq!(parse_range("bytes=100-", 100), Unsatisfiable);
        assert_eq!(parse_range("bytes=-0", 100), Unsatisfiable);
        assert_eq!(parse_range("bytes=0-0", 0), Unsatisfiable);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), Ignored);
        assert_eq!(parse_range("bytes=9-1", 100), Ignored);
        assert_eq!(parse_range("items=0-1", 100), Ignored);
        assert_eq!(parse_range("bytes=x-1", 100), Ignored);
    }

    #[tokio::test]
    async fn serves_byte_ranges() {
        let sb = Sandbox::new("down-range");
        let data: Vec<u8> = (0..600_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(sb.path("r.bin"), &data).unwrap();
        let ranged = |range: &str| {
            let mut request = get("/files?path=r.bin");
            request
                .headers_mut()
                .insert("range", range.parse().unwrap());
            request
                .headers_mut()
                .insert("accept-encoding", "gzip".parse().unwrap());
            request
        };
        let response = send(&sb, ranged("bytes=300000-599999")).await;
        assert_eq!(response.status(), StatusCode::PARTIAL_CONTENT);
        assert_eq!(
            response.headers()["content-range"],
            "bytes 300000-599999/600000"
        );
        assert!(response.headers().get("content-encoding").is_none());
        assert_eq!(body_bytes(response).await, &data[300_000..]);
        let response = send(&sb, ranged("bytes=-5")).await;
        assert_eq!(body_bytes(response).await, &data[599_995..]);
        let response = send(&sb, ranged("bytes=600000-")).await;
        assert_eq!(response.status(), StatusCode::RANGE_NOT_SATISFIABLE);
        assert_eq!(response.headers()["content-range"], "bytes */600000");
        let response = send(&sb, ranged("bytes=0-1,4-5")).await;
        assert_eq!(response.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn download_errors() {
        let sb = Sandbox::new("down-err");
        let missing = sb.path("missing.txt");
        let err = json(&sb, get("/files?path=missing.txt"), StatusCode::NOT_FOUND).await;
        assert_eq!(
            err["message"],
            format!("path '{}' does not exist", missing.display())
        );
        let err = json(&sb, get("/files?path=~"), StatusCode::BAD_REQUEST).await;
        assert!(err["message"].as_str().unwrap().ends_with("is a directory"));
        std::fs::write(sb.path("f"), b"x").unwrap();
        let mut request = get("/files?path=f");
        request
            .headers_mut()
            .insert("accept-encoding", "br, identity;q=0".parse().unwrap());
        let err = json(&sb, request, StatusCode::NOT_ACCEPTABLE).await;
        assert_eq!(err["code"], 406);
        json(
            &sb,
            get("/files?path=f&username=ghost"),
            StatusCode::UNAUTHORIZED,
        )
        .await;
    }

    #[tokio::test]
    async fn signed_download() {
        let sb = Sandbox::new("down-signed");
        sb.state.defaults.write().unwrap().access_token = Some("tok".into());
        std::fs::write(sb.path("f"), b"secret").unwrap();
        json(&sb, get("/files?path=f"), StatusCode::UNAUTHORIZED).await;
        let sig = file_signature("f", FileOperation::Read, "tester", "tok", None);
        let uri = format!(
            "/files?path=f&username=tester&signature={}",
            sig.replace('+', "%2B").replace('/', "%2F")
        );
        let response = send(&sb, get(&uri)).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(body_bytes(response).await, b"secret");
        let mut wrong = get("/files?path=f");
        wrong
            .headers_mut()
            .insert("x-access-token", "nope".parse().unwrap());
        json(&sb, wrong, StatusCode::UNAUTHORIZED).await;
    }

    #[test]
    fn negotiates_like_e2b() {
        use ResponseEncoding::*;
        let n = |h: Option<&str>| negotiate_encoding(h);
        assert_eq!(n(None), Ok(Identity));
        assert_eq!(n(Some("")), Ok(Identity));
        assert_eq!(n(Some("gzip")), Ok(Gzip));
        assert_eq!(n(Some("GZIP")), Ok(Gzip));
        assert_eq!(n(Some("gzip, deflate, br")), Ok(Gzip));
        assert_eq!(n(Some("br")), Ok(Identity));
        assert_eq!(n(Some("identity;q=0.5, gzip;q=0.9")), Ok(Gzip));
        assert_eq!(n(Some("gzip;q=0.5, identity")), Ok(Identity));
        assert_eq!(n(Some("gzip;q=0")), Ok(Identity));
        assert_eq!(n(Some("*")), Ok(Identity));
        assert_eq!(n(Some("*, identity;q=0")), Ok(Gzip));
        let refused = n(Some("br, identity;q=0")).unwrap_err();
        assert_eq!(refused.status, StatusCode::NOT_ACCEPTABLE);
        assert!(refused.message.contains("supported: [identity, gzip]"));
        assert_eq!(
            n(Some("gzip;q=0, identity;q=0")).unwrap_err().status,
            StatusCode::NOT_ACCEPTABLE
        );
    }
}
