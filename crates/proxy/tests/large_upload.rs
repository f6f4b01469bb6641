//! A 1 GiB upload through the proxy, in its own test process so that the peak
//! resident set measured here belongs to this transfer alone.

mod common;

use berth_envd_proto::ENVD_PORT;
use bytes::Bytes;
use common::{http1_client, OPEN_SANDBOX};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;

const CHUNK: usize = 1 << 20;
const CHUNKS: u64 = 1024;

/// Peak resident set size of this process (`VmHWM`), in bytes.
fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_upload_streams_with_bounded_memory() {
    let harness = common::start().await;
    let peak_before = peak_rss_bytes();

    // Every chunk shares one allocation, so the client side holds 1 MiB at most.
    let chunk = Bytes::from(vec![0x5au8; CHUNK]);
    let frames = futures::stream::iter(
        (0..CHUNKS).map(move |_| Ok::<_, berth_proxy::BoxError>(Frame::data(chunk.clone()))),
    );
    let mut client = http1_client(harness.front).await;
    let request = Request::post("/upload")
        .header("host", "127.0.0.1")
        .header("E2b-Sandbox-Id", OPEN_SANDBOX.id)
        .header("E2b-Sandbox-Port", ENVD_PORT.to_string())
        .header("content-length", (CHUNKS * CHUNK as u64).to_string())
        .body(StreamBody::new(frames).boxed_unsync())
        .unwrap();
    let response = client.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let received = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(received, (CHUNKS * CHUNK as u64).to_string());

    let growth = peak_rss_bytes().saturating_sub(peak_before);
    eprintln!(
        "peak RSS growth during a 1 GiB upload: {} MiB",
        growth >> 20
    );
    // A proxy that buffered the body would grow by about 1 GiB.
    assert!(growth < 128 << 20, "peak RSS grew by {growth} bytes");
}
