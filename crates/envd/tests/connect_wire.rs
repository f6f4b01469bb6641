//! Drives the real `berth-envd` binary over HTTP with the Connect protocol: unary JSON
//! and proto, server streams in both codecs, the StreamInput client stream, bad
//! envelopes, wrong content types, unknown processes, timeouts and keepalives.

use std::convert::Infallible;
use std::time::Duration;

use berth_envd_proto::connect::{encode_envelope, Codec, FLAG_END_STREAM};
use berth_envd_proto::process::{
    process_event, ListRequest, ListResponse, ProcessConfig, StartRequest, StartResponse,
};
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

type Body = BoxBody<Bytes, Infallible>;

mod common;
use common::Envd;

fn http1_client() -> Client<HttpConnector, Body> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn empty() -> Body {
    Full::new(Bytes::new()).boxed()
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

async fn post(
    client: &Client<HttpConnector, Body>,
    url: &str,
    content_type: &str,
    headers: &[(&str, &str)],
    body: Body,
) -> Response<Incoming> {
    let mut request = Request::post(url).header("content-type", content_type);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    client.request(request.body(body).unwrap()).await.unwrap()
}

async fn body_bytes(response: Response<Incoming>) -> Bytes {
    response.into_body().collect().await.unwrap().to_bytes()
}

/// Splits a stream body into (flags, payload) frames.
fn frames(mut body: &[u8]) -> Vec<(u8, Bytes)> {
    let mut out = Vec::new();
    while !body.is_empty() {
        let (envelope, used) =
            berth_envd_proto::connect::decode_envelope(body, usize::MAX).unwrap();
        out.push((envelope.flags, envelope.payload));
        body = &body[used..];
    }
    out
}

fn json_envelope(message: Value) -> Body {
    full(encode_envelope(0, &serde_json::to_vec(&message).unwrap()))
}

fn bash(script: &str) -> Value {
    json!({"process": {"cmd": "/bin/bash", "args": ["-c", script]}})
}

/// Reads one frame from a streaming response body as it arrives.
struct FrameReader {
    body: Incoming,
    buffer: Vec<u8>,
}

impl FrameReader {
    fn new(response: Response<Incoming>) -> Self {
        Self {
            body: response.into_body(),
            buffer: Vec::new(),
        }
    }

    async fn next(&mut self) -> Option<(u8, Value)> {
        loop {
            if let Ok((envelope, used)) =
                berth_envd_proto::connect::decode_envelope(&self.buffer, usize::MAX)
            {
                self.buffer.drain(..used);
                return Some((
                    envelope.flags,
                    serde_json::from_slice(&envelope.payload).unwrap(),
                ));
            }
            let frame = self.body.frame().await?.unwrap();
            if let Ok(data) = frame.into_data() {
                self.buffer.extend_from_slice(&data);
            }
        }
    }
}

fn end_error_code(frame: &(u8, Bytes)) -> Option<String> {
    assert!(frame.0 & FLAG_END_STREAM != 0, "not an end-of-stream frame");
    let end: Value = serde_json::from_slice(&frame.1).unwrap();
    end["error"]["code"].as_str().map(str::to_owned)
}

async fn list_pids(envd: &Envd, client: &Client<HttpConnector, Body>) -> Vec<u64> {
    let response = post(
        client,
        &envd.url("/process.Process/List"),
        "application/json",
        &[],
        full("{}"),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let list: Value = serde_json::from_slice(&body_bytes(response).await).unwrap();
    list["processes"]
        .as_array()
        .map(|processes| {
            processes
                .iter()
                .map(|p| p["pid"].as_u64().unwrap())
                .collect()
        })
        .unwrap_or_default()
}

async fn kill(envd: &Envd, client: &Client<HttpConnector, Body>, pid: u64) -> StatusCode {
    let body = json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}).to_string();
    post(
        client,
        &envd.url("/process.Process/SendSignal"),
        "application/json",
        &[],
        full(body),
    )
    .await
    .status()
}

#[tokio::test]
async fn json_server_stream_carries_output_and_exit() {
    let envd = Envd::start().await;
    let client = http1_client();
    let response = post(
        &client,
        &envd.url("/process.Process/Start"),
        "application/connect+json",
        &[],
        json_envelope(bash("echo out; echo err >&2; exit 7")),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"],
        "application/connect+json"
    );
    let frames = frames(&body_bytes(response).await);
    let (last, events) = frames.split_last().unwrap();
    assert_eq!(end_error_code(last), None);
    let events: Vec<Value> = events
        .iter()
        .map(|(_, payload)| serde_json::from_slice::<Value>(payload).unwrap()["event"].clone())
        .collect();
    assert!(events[0]["start"]["pid"].as_u64().unwrap() > 0);
    let collect = |key: &str| -> String {
        events
            .iter()
            .filter_map(|e| e["data"][key].as_str())
            .map(|b64| {
                use base64::Engine;
                String::from_utf8(
                    base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .unwrap(),
                )
                .unwrap()
            })
            .collect()
    };
    assert_eq!(collect("stdout"), "out\n");
    assert_eq!(collect("stderr"), "err\n");
    let end = &events.last().unwrap()["end"];
    assert_eq!(end["exitCode"], 7);
    assert_eq!(end["exited"], true);
    assert_eq!(end["status"], "exit status 7");
}

#[tokio::test]
async fn proto_stream_and_proto_unary() {
    let envd = Envd::start().await;
    let client = http1_client();
    let start = StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/sleep".into(),
            args: vec!["30".into()],
            ..Default::default()
        }),
        tag: Some("proto-sleeper".into()),
        ..Default::default()
    };
    let response = post(
        &client,
        &envd.url("/process.Process/Start"),
        "application/connect+proto",
        &[],
        full(encode_envelope(0, &Codec::Proto.encode(&start))),
    )
    .await;
    assert_eq!(
        response.headers()["content-type"],
        "application/connect+proto"
    );
    let mut body = response.into_body();
    let mut buffer = Vec::new();
    let first = loop {
        if let Ok((envelope, _)) = berth_envd_proto::connect::decode_envelope(&buffer, usize::MAX) {
            break envelope;
        }
        buffer.extend_from_slice(&body.frame().await.unwrap().unwrap().into_data().unwrap());
    };
    let started: StartResponse = Codec::Proto.decode(&first.payload).unwrap();
    let Some(process_event::Event::Start(process_event::StartEvent { pid })) =
        started.event.unwrap().event
    else {
        panic!("the first event is not a start event");
    };

    let response = post(
        &client,
        &envd.url("/process.Process/List"),
        "application/proto",
        &[],
        full(Codec::Proto.encode(&ListRequest {})),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/proto");
    let list: ListResponse = Codec::Proto.decode(&body_bytes(response).await).unwrap();
    let listed = list.processes.iter().find(|p| p.pid == pid).unwrap();
    assert_eq!(listed.tag.as_deref(), Some("proto-sleeper"));
    assert_eq!(listed.config.as_ref().unwrap().cmd, "/bin/sleep");
    assert_eq!(kill(&envd, &client, pid.into()).await, StatusCode::OK);
}

#[tokio::test]
async fn stream_input_feeds_stdin_in_order() {
    let envd = Envd::start().await;
    let client = http1_client();
    let mut start = bash("cat");
    start["stdin"] = json!(true);
    start["tag"] = json!("cat-tag");
    let response = post(
        &client,
        &envd.url("/process.Process/Start"),
        "application/connect+json",
        &[],
        json_envelope(start),
    )
    .await;
    let mut output = FrameReader::new(response);
    let (_, first) = output.next().await.unwrap();
    let pid = first["event"]["start"]["pid"].as_u64().unwrap();

    // A client stream whose frames are sent one by one.
    let (sender, receiver) =
        futures::channel::mpsc::unbounded::<Result<Frame<Bytes>, Infallible>>();
    let input_body = BodyExt::boxed(StreamBody::new(receiver));
    let call = {
        let client = client.clone();
        let url = envd.url("/process.Process/StreamInput");
        tokio::spawn(async move {
            post(&client, &url, "application/connect+json", &[], input_body).await
        })
    };
    let send = |message: Value| {
        let frame = encode_envelope(0, &serde_json::to_vec(&message).unwrap());
        sender.unbounded_send(Ok(Frame::data(frame))).unwrap();
    };
    use base64::Engine;
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    send(json!({"start": {"process": {"tag": "cat-tag"}}}));
    for word in ["one ", "two ", "three\n"] {
        send(json!({"data": {"input": {"stdin": b64(word)}}}));
    }
    send(json!({"keepalive": {}}));
    drop(sender);
    let response = call.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let reply = frames(&body_bytes(response).await);
    assert_eq!(reply.len(), 2);
    assert_eq!(&reply[0].1[..], b"{}");
    assert_eq!(end_error_code(&reply[1]), None);

    let body = json!({"process": {"pid": pid}}).to_string();
    let closed = post(
        &client,
        &envd.url("/process.Process/CloseStdin"),
        "application/json",
        &[],
        full(body),
    )
    .await;
    assert_eq!(closed.status(), StatusCode::OK);

    let mut echoed = Vec::new();
    let end = loop {
        let (flags, frame) = output.next().await.unwrap();
        assert_eq!(flags & FLAG_END_STREAM, 0, "stream ended early: {frame}");
        if let Some(data) = frame["event"]["data"]["stdout"].as_str() {
            echoed.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap(),
            );
        }
        if !frame["event"]["end"].is_null() {
            break frame["event"]["end"].clone();
        }
    };
    assert_eq!(String::from_utf8(echoed).unwrap(), "one two three\n");
    assert_eq!(end["status"], "exit status 0");
}

#[tokio::test]
async fn stream_input_must_start_with_a_process() {
    let envd = Envd::start().await;
    let client = http1_client();
    let response = post(
        &client,
        &envd.url("/process.Process/StreamInput"),
        "application/connect+json",
        &[],
        json_envelope(json!({"data": {"input": {"stdin": "eA=="}}})),
    )
    .await;
    let reply = frames(&body_bytes(response).await);
    assert_eq!(
        end_error_code(reply.last().unwrap()).as_deref(),
        Some("failed_precondition")
    );
}

#[tokio::test]
async fn bad_envelopes_get_connect_errors() {
    let envd = Envd::start().await;
    let client = http1_client();
    let url = envd.url("/process.Process/Start");
    let truncated: &[u8] = &[0, 0, 0, 0, 100, b'{', b'}'];
    let response = post(
        &client,
        &url,
        "application/connect+json",
        &[],
        full(truncated.to_vec()),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let reply = frames(&body_bytes(response).await);
    assert_eq!(
        end_error_code(&reply[0]).as_deref(),
        Some("invalid_argument")
    );

    let header_only: &[u8] = &[0, 0, 0];
    let response = post(
        &client,
        &url,
        "application/connect+json",
        &[],
        full(header_only.to_vec()),
    )
    .await;
    let reply = frames(&body_bytes(response).await);
    assert_eq!(
        end_error_code(&reply[0]).as_deref(),
        Some("invalid_argument")
    );

    let oversized: &[u8] = &[0, 0xff, 0xff, 0xff, 0xff, b'{'];
    let response = post(
        &client,
        &url,
        "application/connect+json",
        &[],
        full(oversized.to_vec()),
    )
    .await;
    let reply = frames(&body_bytes(response).await);
    assert_eq!(
        end_error_code(&reply[0]).as_deref(),
        Some("resource_exhausted")
    );

    let compressed = encode_envelope(1, b"{}");
    let response = post(
        &client,
        &url,
        "application/connect+json",
        &[],
        full(compressed),
    )
    .await;
    let reply = frames(&body_bytes(response).await);
    assert_eq!(end_error_code(&reply[0]).as_deref(), Some("unimplemented"));

    let mut two = encode_envelope(0, b"{}").to_vec();
    two.extend_from_slice(&encode_envelope(0, b"{}"));
    let response = post(&client, &url, "application/connect+json", &[], full(two)).await;
    let reply = frames(&body_bytes(response).await);
    assert_eq!(
        end_error_code(&reply[0]).as_deref(),
        Some("invalid_argument")
    );

    // A client stream cut inside an envelope.
    let mut cut = encode_envelope(0, br#"{"start":{"process":{"pid":1}}}"#).to_vec();
    cut.truncate(cut.len() - 3);
    let response = post(
        &client,
        &envd.url("/process.Process/StreamInput"),
        "application/connect+json",
        &[],
        full(cut),
    )
    .await;
    let reply = frames(&body_bytes(response).await);
    assert_eq!(
        end_error_code(reply.last().unwrap()).as_deref(),
        Some("invalid_argument")
    );
}

#[tokio::test]
async fn content_types_and_malformed_messages() {
    let envd = Envd::start().await;
    let client = http1_client();
    let list = envd.url("/process.Process/List");
    let response = post(&client, &list, "text/plain", &[], full("{}")).await;
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert!(response.headers().contains_key("accept-post"));

    let response = post(
        &client,
        &list,
        "application/connect+json",
        &[],
        json_envelope(json!({})),
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let start = envd.url("/process.Process/Start");
    let response = post(
        &client,
        &start,
        "application/json",
        &[],
        full(bash("true").to_string()),
    )
    .await;
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let response = post(
        &client,
        &list,
        "application/json",
        &[],
        full("{\"unknownField\": [1, 2]}"),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);

    let response = post(
        &client,
        &list,
        "application/json",
        &[],
        full("{\"broken\": "),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = serde_json::from_slice(&body_bytes(response).await).unwrap();
    assert_eq!(error["code"], "invalid_argument");
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains("malformed JSON"));

    let signal = envd.url("/process.Process/SendSignal");
    let response = post(
        &client,
        &signal,
        "application/json",
        &[],
        full(r#"{"process": {"pid": "x"}}"#),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);

    let response = post(
        &client,
        &list,
        "application/proto",
        &[],
        full(vec![0x0a, 0x64, b'a']),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let error: Value = serde_json::from_slice(&body_bytes(response).await).unwrap();
    assert_eq!(error["code"], "invalid_argument");
}

#[tokio::test]
async fn unknown_processes_are_not_found() {
    let envd = Envd::start().await;
    let client = http1_client();
    // Pids are below 2^22 on Linux, so this one never exists.
    let missing_pid = 4_000_000_000u64;
    assert_eq!(
        kill(&envd, &client, missing_pid).await,
        StatusCode::NOT_FOUND
    );
    for (method, body) in [
        (
            "SendInput",
            json!({"process": {"pid": missing_pid}, "input": {"stdin": "eA=="}}),
        ),
        ("CloseStdin", json!({"process": {"tag": "no-such-tag"}})),
        (
            "Update",
            json!({"process": {"tag": "no-such-tag"}, "pty": {"size": {"cols": 10, "rows": 10}}}),
        ),
    ] {
        let response = post(
            &client,
            &envd.url(&format!("/process.Process/{method}")),
            "application/json",
            &[],
            full(body.to_string()),
        )
        .await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{method}");
        let error: Value = serde_json::from_slice(&body_bytes(response).await).unwrap();
        assert_eq!(error["code"], "not_found", "{method}");
        assert!(!error["message"].as_str().unwrap().is_empty());
    }
    let response = post(
        &client,
        &envd.url("/process.Process/Connect"),
        "application/connect+json",
        &[],
        json_envelope(json!({"process": {"tag": "no-such-tag"}})),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let reply = frames(&body_bytes(response).await);
    assert_eq!(reply.len(), 1);
    assert_eq!(end_error_code(&reply[0]).as_deref(), Some("not_found"));
}

#[tokio::test]
async fn start_timeout_kills_but_disconnect_detaches() {
    let envd = Envd::start().await;
    let client = http1_client();
    let start = envd.url("/process.Process/Start");

    // The time limit passes with the stream attached: the process is killed.
    let response = post(
        &client,
        &start,
        "application/connect+json",
        &[("connect-timeout-ms", "300")],
        json_envelope(bash("sleep 30")),
    )
    .await;
    let mut reader = FrameReader::new(response);
    let pid = reader.next().await.unwrap().1["event"]["start"]["pid"]
        .as_u64()
        .unwrap();
    let (flags, end) = reader.next().await.unwrap();
    assert_ne!(flags & FLAG_END_STREAM, 0);
    assert_eq!(end["error"]["code"], "deadline_exceeded");
    let mut gone = false;
    for _ in 0..500 {
        if !list_pids(&envd, &client).await.contains(&pid) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(gone, "the timed-out process is still listed");

    // The client goes away long before its time limit: the process keeps running.
    let response = post(
        &client,
        &start,
        "application/connect+json",
        &[("connect-timeout-ms", "600000")],
        json_envelope(bash("sleep 30")),
    )
    .await;
    let mut reader = FrameReader::new(response);
    let pid = reader.next().await.unwrap().1["event"]["start"]["pid"]
        .as_u64()
        .unwrap();
    drop(reader);
    let response = post(
        &client,
        &envd.url("/process.Process/Connect"),
        "application/connect+json",
        &[("keepalive-ping-interval", "1")],
        json_envelope(json!({"process": {"pid": pid}})),
    )
    .await;
    let mut reattached = FrameReader::new(response);
    assert_eq!(
        reattached.next().await.unwrap().1["event"]["start"]["pid"],
        pid
    );
    // Idle for a second: a keepalive event arrives.
    assert!(reattached.next().await.unwrap().1["event"]["keepalive"].is_object());
    assert!(list_pids(&envd, &client).await.contains(&pid));
    assert_eq!(kill(&envd, &client, pid).await, StatusCode::OK);
    let end = loop {
        let (_, frame) = reattached.next().await.unwrap();
        if !frame["event"]["end"].is_null() {
            break frame["event"]["end"].clone();
        }
    };
    assert_eq!(end["status"], "signal: killed");
    assert_eq!(end["exitCode"], -1);

    // Finished but retained: Connect replays start and end; signals are not_found.
    let response = post(
        &client,
        &envd.url("/process.Process/Connect"),
        "application/connect+json",
        &[],
        json_envelope(json!({"process": {"pid": pid}})),
    )
    .await;
    let replay = frames(&body_bytes(response).await);
    assert_eq!(replay.len(), 3);
    let replayed_end: Value = serde_json::from_slice(&replay[1].1).unwrap();
    assert_eq!(replayed_end["event"]["end"]["status"], "signal: killed");
    assert_eq!(kill(&envd, &client, pid).await, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn pty_runs_on_a_terminal_and_resizes() {
    let envd = Envd::start().await;
    let client = http1_client();
    let response = post(
        &client,
        &envd.url("/process.Process/Start"),
        "application/connect+json",
        &[],
        json_envelope(json!({
            "process": {"cmd": "/bin/bash", "args": ["-c", "read line; stty size; echo got:$line"]},
            "pty": {"size": {"cols": 90, "rows": 20}},
        })),
    )
    .await;
    let mut output = FrameReader::new(response);
    let pid = output.next().await.unwrap().1["event"]["start"]["pid"]
        .as_u64()
        .unwrap();
    let update = json!({"process": {"pid": pid}, "pty": {"size": {"cols": 120, "rows": 40}}});
    let response = post(
        &client,
        &envd.url("/process.Process/Update"),
        "application/json",
        &[],
        full(update.to_string()),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let input = json!({"process": {"pid": pid}, "input": {"pty": "aGVsbG8K"}});
    let response = post(
        &client,
        &envd.url("/process.Process/SendInput"),
        "application/json",
        &[],
        full(input.to_string()),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut screen = Vec::new();
    loop {
        let (_, frame) = output.next().await.unwrap();
        if let Some(data) = frame["event"]["data"]["pty"].as_str() {
            use base64::Engine;
            screen.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap(),
            );
        }
        if !frame["event"]["end"].is_null() {
            assert_eq!(frame["event"]["end"]["status"], "exit status 0");
            break;
        }
    }
    let screen = String::from_utf8_lossy(&screen);
    assert!(screen.contains("40 120"), "{screen}");
    assert!(screen.contains("got:hello"), "{screen}");
}

#[tokio::test]
async fn h2c_serves_unary_and_streams() {
    let envd = Envd::start().await;
    let client: Client<HttpConnector, Body> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let response = client
        .request(Request::get(envd.url("/health")).body(empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let response = post(
        &client,
        &envd.url("/process.Process/Start"),
        "application/connect+json",
        &[],
        json_envelope(bash("echo h2")),
    )
    .await;
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    let frames = frames(&body_bytes(response).await);
    assert_eq!(end_error_code(frames.last().unwrap()), None);
    let stdout: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|(_, payload)| serde_json::from_slice(payload).unwrap())
        .filter(|event: &Value| event["event"]["data"]["stdout"].is_string())
        .collect();
    assert_eq!(stdout[0]["event"]["data"]["stdout"], "aDIK");
}

#[tokio::test]
async fn many_concurrent_commands() {
    let envd = Envd::start().await;
    let client = http1_client();
    let runs = (0..50).map(|i| {
        let client = client.clone();
        let url = envd.url("/process.Process/Start");
        async move {
            let response = post(
                &client,
                &url,
                "application/connect+json",
                &[],
                json_envelope(bash(&format!("exit {}", i % 5))),
            )
            .await;
            let frames = frames(&body_bytes(response).await);
            let end: Value = serde_json::from_slice(&frames[frames.len() - 2].1).unwrap();
            (
                i,
                end["event"]["end"]["status"].as_str().unwrap().to_owned(),
            )
        }
    });
    let results = futures::stream::iter(runs)
        .buffer_unordered(50)
        .collect::<Vec<_>>()
        .await;
    assert_eq!(results.len(), 50);
    for (i, status) in results {
        assert_eq!(status, format!("exit status {}", i % 5));
    }
}

/// Threads and open descriptors of process `pid`, from /proc.
fn threads_and_fds(pid: u32) -> (usize, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let threads = status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    (threads, fds)
}

/// What the SDKs do for every `commands.run`: a `Start` stream with
/// `Keepalive-Ping-Interval: 50`. Hundreds of them in a row must not grow envd's threads
/// or descriptors (a leak per command would take a long-lived sandbox down).
#[tokio::test]
async fn keepalive_start_streams_leak_nothing() {
    let envd = Envd::start().await;
    let client = http1_client();
    let url = envd.url("/process.Process/Start");
    let mut baseline = None;
    for i in 0..300 {
        let response = post(
            &client,
            &url,
            "application/connect+json",
            &[("keepalive-ping-interval", "50")],
            json_envelope(json!({"process": {"cmd": "true"}})),
        )
        .await;
        let frames = frames(&body_bytes(response).await);
        let end: Value = serde_json::from_slice(&frames[frames.len() - 2].1).unwrap();
        assert_eq!(
            end["event"]["end"]["status"], "exit status 0",
            "command {i}"
        );
        if i == 20 {
            baseline = Some(threads_and_fds(envd.pid()));
        }
    }
    let (threads, fds) = baseline.unwrap();
    let (threads_after, fds_after) = threads_and_fds(envd.pid());
    // Slack for a pipe or connection still closing when sampled; a per-command leak
    // would add hundreds.
    assert!(
        threads_after <= threads + 2 && fds_after <= fds + 4,
        "after 20 commands: {threads} threads, {fds} fds; after 300: {threads_after} threads, {fds_after} fds"
    );
}

/// Sends one request whose body arrives after its headers, then `GET /health` on the same
/// connection; returns both status lines.
async fn late_body_then_health(envd: &Envd, head: &str, body: &[u8]) -> (String, String) {
    let address = envd.url("").trim_start_matches("http://").to_owned();
    let health = "GET /health HTTP/1.1\r\nHost: envd\r\n\r\n";
    let (first, next) =
        berth_leftover_body::testing::late_body_then(&address, head, body, health).await;
    let (next, _) = next.expect("the connection carried no second request");
    (first, next)
}

#[tokio::test]
async fn a_rejected_request_keeps_its_connection() {
    let envd = Envd::start().await;
    // An unknown procedure: 404, and the connection still serves the next request (a
    // client reusing it must not meet a closed socket).
    let (rejected, next) = late_body_then_health(
        &envd,
        "POST /nowhere.Service/List HTTP/1.1\r\nContent-Type: application/json\r\n",
        b"{}",
    )
    .await;
    assert!(rejected.starts_with("HTTP/1.1 404"), "{rejected}");
    assert!(next.starts_with("HTTP/1.1 204"), "{next}");

    // A content type the procedure does not take: 415, same.
    let (rejected, next) = late_body_then_health(
        &envd,
        "POST /process.Process/List HTTP/1.1\r\nContent-Type: text/plain\r\n",
        b"{}",
    )
    .await;
    assert!(rejected.starts_with("HTTP/1.1 415"), "{rejected}");
    assert!(next.starts_with("HTTP/1.1 204"), "{next}");

    // Once a token is set, a request without it: 401, same.
    let init = b"{\"accessToken\": \"secret-token\"}";
    let (accepted, _) = late_body_then_health(
        &envd,
        "POST /init HTTP/1.1\r\nContent-Type: application/json\r\n",
        init,
    )
    .await;
    assert!(accepted.starts_with("HTTP/1.1 204"), "{accepted}");
    let (rejected, next) = late_body_then_health(
        &envd,
        "POST /process.Process/List HTTP/1.1\r\nContent-Type: application/json\r\n",
        b"{}",
    )
    .await;
    assert!(rejected.starts_with("HTTP/1.1 401"), "{rejected}");
    assert!(next.starts_with("HTTP/1.1 204"), "{next}");
}
