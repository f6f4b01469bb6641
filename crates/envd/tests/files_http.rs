//! Drives the real `berth-envd` binary's plain HTTP routes: `/files` both ways (streamed,
//! gzip, multipart, metadata, ownership), `/files/compose`, `/init` with tokens and
//! signed URLs, `/envs` and `/metrics`. Every path used lives in a temporary directory.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use base64::Engine;
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

type Body = BoxBody<Bytes, std::io::Error>;
type HttpClient = Client<HttpConnector, Body>;

const MIB: usize = 1 << 20;

mod common;
use common::Envd;

/// Peak resident memory of process `pid` so far, in bytes.
fn peak_rss(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("berth-envd-files-it-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self, rel: &str) -> String {
        self.0.join(rel).to_string_lossy().into_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn empty() -> Body {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

fn query_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn send(
    client: &HttpClient,
    request: hyper::http::request::Builder,
    body: Body,
) -> Response<Incoming> {
    client.request(request.body(body).unwrap()).await.unwrap()
}

async fn bytes_of(response: Response<Incoming>) -> Bytes {
    response.into_body().collect().await.unwrap().to_bytes()
}

async fn json_of(response: Response<Incoming>, status: StatusCode) -> Value {
    let got = response.status();
    let bytes = bytes_of(response).await;
    assert_eq!(got, status, "{}", String::from_utf8_lossy(&bytes));
    serde_json::from_slice(&bytes).unwrap()
}

/// Deterministic content, cheap to make and check: a fixed 1 MiB pattern stamped with
/// the chunk's index (so lost, repeated or reordered chunks are caught).
fn pattern_chunk(base: &[u8], index: usize) -> Vec<u8> {
    let mut chunk = base.to_vec();
    chunk[..8].copy_from_slice(&(index as u64).to_le_bytes());
    chunk
}

fn pattern_base() -> Vec<u8> {
    (0..MIB).map(|i| (i % 251) as u8).collect()
}

/// Uploads and downloads 256 MiB: both directions stream, so envd's peak memory stays a
/// small fraction of the file.
#[tokio::test]
async fn large_transfers_stream_in_bounded_memory() {
    let envd = Envd::start().await;
    let dir = TempDir::new("large");
    let client = client();
    const CHUNKS: usize = 256;
    let target = dir.path("big/file.bin");

    let base = pattern_base();
    let chunks: Vec<Bytes> = (0..CHUNKS)
        .map(|i| Bytes::from(pattern_chunk(&base, i)))
        .collect();
    let body = BodyExt::boxed(StreamBody::new(
        futures::stream::iter(chunks.clone()).map(|c| Ok::<_, std::io::Error>(Frame::data(c))),
    ));
    let started = Instant::now();
    let response = send(
        &client,
        Request::post(envd.url(&format!("/files?path={}", query_escape(&target))))
            .header("content-type", "application/octet-stream"),
        body,
    )
    .await;
    let uploaded = json_of(response, StatusCode::OK).await;
    let upload_secs = started.elapsed().as_secs_f64();
    assert_eq!(uploaded[0]["path"], target);
    assert_eq!(
        std::fs::metadata(&target).unwrap().len(),
        (CHUNKS * MIB) as u64
    );

    let started = Instant::now();
    let response = send(
        &client,
        Request::get(envd.url(&format!("/files?path={}", query_escape(&target)))),
        empty(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-length"],
        (CHUNKS * MIB).to_string().as_str()
    );
    let mut body = response.into_body();
    let mut total = 0;
    while let Some(frame) = body.frame().await {
        let Ok(mut data) = frame.unwrap().into_data() else {
            continue;
        };
        while !data.is_empty() {
            let (index, offset) = (total / MIB, total % MIB);
            assert!(index < CHUNKS, "more than {CHUNKS} MiB downloaded");
            let take = data.len().min(MIB - offset);
            assert!(
                data[..take] == chunks[index][offset..offset + take],
                "content differs in MiB {index} at offset {offset}"
            );
            data = data.slice(take..);
            total += take;
        }
    }
    let download_secs = started.elapsed().as_secs_f64();
    assert_eq!(total, CHUNKS * MIB);

    let peak = peak_rss(envd.pid());
    eprintln!(
        "256 MiB: upload {:.0} MiB/s, download {:.0} MiB/s, envd peak RSS {} MiB",
        CHUNKS as f64 / upload_secs,
        CHUNKS as f64 / download_secs,
        peak / MIB
    );
    assert!(
        peak < 96 * MIB,
        "envd peaked at {} MiB for a 256 MiB transfer",
        peak / MIB
    );
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

#[tokio::test]
async fn multipart_gzip_metadata_and_compose() {
    let envd = Envd::start().await;
    let dir = TempDir::new("multipart");
    let client = client();

    let boundary = "berthBoundary42";
    let mut body = Vec::new();
    for (name, content) in [("m/one.txt", "first"), ("m/two.txt", "second")] {
        write!(
            body,
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{}\"\r\n\r\n{content}\r\n",
            dir.path(name)
        )
        .unwrap();
    }
    write!(body, "--{boundary}--\r\n").unwrap();
    let response = send(
        &client,
        Request::post(envd.url("/files"))
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .header("x-metadata-Origin", "it-test"),
        full(body),
    )
    .await;
    let written = json_of(response, StatusCode::OK).await;
    assert_eq!(written.as_array().unwrap().len(), 2);
    assert_eq!(written[1]["name"], "two.txt");
    assert_eq!(written[1]["metadata"], json!({"origin": "it-test"}));
    assert_eq!(std::fs::read(dir.path("m/two.txt")).unwrap(), b"second");

    // gzip upload, gzip download.
    let text = "compressible ".repeat(10_000);
    let gz_target = dir.path("gz.txt");
    let response = send(
        &client,
        Request::post(envd.url(&format!("/files?path={}", query_escape(&gz_target))))
            .header("content-type", "application/octet-stream")
            .header("content-encoding", "gzip"),
        full(gzip(text.as_bytes())),
    )
    .await;
    json_of(response, StatusCode::OK).await;
    let response = send(
        &client,
        Request::get(envd.url(&format!("/files?path={}", query_escape(&gz_target))))
            .header("accept-encoding", "gzip"),
        empty(),
    )
    .await;
    assert_eq!(response.headers()["content-encoding"], "gzip");
    let compressed = bytes_of(response).await;
    assert!(compressed.len() < text.len() / 10);
    let mut plain = String::new();
    flate2::read::GzDecoder::new(&compressed[..])
        .read_to_string(&mut plain)
        .unwrap();
    assert_eq!(plain, text);

    // Compose the two multipart files.
    let response = send(
        &client,
        Request::post(envd.url("/files/compose")).header("content-type", "application/json"),
        full(
            json!({
                "source_paths": [dir.path("m/one.txt"), dir.path("m/two.txt")],
                "destination": dir.path("composed.txt"),
            })
            .to_string(),
        ),
    )
    .await;
    let composed = json_of(response, StatusCode::OK).await;
    assert_eq!(composed["name"], "composed.txt");
    assert_eq!(
        std::fs::read(dir.path("composed.txt")).unwrap(),
        b"firstsecond"
    );
    assert!(!Path::new(&dir.path("m/one.txt")).exists());

    // Errors are JSON naming the path.
    let missing = dir.path("missing.txt");
    let response = send(
        &client,
        Request::get(envd.url(&format!("/files?path={}", query_escape(&missing)))),
        empty(),
    )
    .await;
    let err = json_of(response, StatusCode::NOT_FOUND).await;
    assert_eq!(err["code"], 404);
    assert!(err["message"].as_str().unwrap().contains(&missing));
}

fn signature(path: &str, operation: &str, username: &str, token: &str) -> String {
    let digest = Sha256::digest(format!("{path}:{operation}:{username}:{token}"));
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

#[tokio::test]
async fn init_token_signed_urls_envs_and_metrics() {
    let envd = Envd::start().await;
    let dir = TempDir::new("init");
    let client = client();

    let metrics = json_of(
        send(&client, Request::get(envd.url("/metrics")), empty()).await,
        StatusCode::OK,
    )
    .await;
    for key in [
        "ts",
        "cpu_count",
        "cpu_used_pct",
        "mem_total",
        "mem_used",
        "mem_cache",
        "mem_total_mib",
        "mem_used_mib",
        "disk_used",
        "disk_total",
    ] {
        assert!(metrics[key].is_number(), "{key} in {metrics}");
    }

    let response = send(
        &client,
        Request::post(envd.url("/init")).header("content-type", "application/json"),
        full(json!({"accessToken": "secret-token", "envVars": {"FOO": "bar"}}).to_string()),
    )
    .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);

    let response = send(&client, Request::get(envd.url("/envs")), empty()).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let envs = json_of(
        send(
            &client,
            Request::get(envd.url("/envs")).header("x-access-token", "secret-token"),
            empty(),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(envs, json!({"FOO": "bar"}));

    // /init now needs the token too.
    let response = send(
        &client,
        Request::post(envd.url("/init")).header("content-type", "application/json"),
        full(json!({"accessToken": "stolen"}).to_string()),
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    // Signed write, then signed read, without the token header.
    let path = dir.path("signed.txt");
    let write_sig = signature(&path, "write", "", "secret-token");
    let response = send(
        &client,
        Request::post(envd.url(&format!(
            "/files?path={}&signature={}",
            query_escape(&path),
            query_escape(&write_sig)
        )))
        .header("content-type", "application/octet-stream"),
        full("signed content"),
    )
    .await;
    json_of(response, StatusCode::OK).await;
    let read_sig = signature(&path, "read", "", "secret-token");
    let response = send(
        &client,
        Request::get(envd.url(&format!(
            "/files?path={}&signature={}",
            query_escape(&path),
            query_escape(&read_sig)
        ))),
        empty(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(bytes_of(response).await, "signed content");
    // The write signature does not grant reads.
    let response = send(
        &client,
        Request::get(envd.url(&format!(
            "/files?path={}&signature={}",
            query_escape(&path),
            query_escape(&write_sig)
        ))),
        empty(),
    )
    .await;
    let err = json_of(response, StatusCode::UNAUTHORIZED).await;
    assert_eq!(err["message"], "invalid signature");
}

/// As root, files and the directories created for them belong to the requested user.
#[tokio::test]
async fn uploads_are_owned_by_the_requested_user() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root to give files away");
        return;
    }
    let envd = Envd::start().await;
    let dir = TempDir::new("owner");
    let client = client();
    let target = dir.path("made/for/nobody.txt");
    let response = send(
        &client,
        Request::post(envd.url(&format!(
            "/files?path={}&username=nobody",
            query_escape(&target)
        )))
        .header("content-type", "application/octet-stream"),
        full("x"),
    )
    .await;
    json_of(response, StatusCode::OK).await;
    for path in [dir.path("made"), dir.path("made/for"), target] {
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "{path}");
    }
    // The existing temp dir itself is left alone.
    assert_eq!(std::fs::metadata(&dir.0).unwrap().uid(), 0);
}
