//! Drives the real `berth-envd` binary's Filesystem Connect service over HTTP/1.1 with
//! the JSON codec, as the SDKs do: every unary RPC, the WatchDir server stream, the
//! polling watchers, users via `Authorization: Basic`, and the error codes of bad input.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

type Body = BoxBody<Bytes, std::convert::Infallible>;
type HttpClient = Client<HttpConnector, Body>;

mod common;

/// A running envd (stopped on drop) and a client for it.
struct Envd {
    process: common::Envd,
    client: HttpClient,
}

impl Envd {
    async fn start() -> Envd {
        Envd {
            process: common::Envd::start().await,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    async fn post(
        &self,
        method: &str,
        content_type: &str,
        user: Option<&str>,
        payload: Bytes,
    ) -> Response<Incoming> {
        let mut request = Request::post(
            self.process
                .url(&format!("/filesystem.Filesystem/{method}")),
        )
        .header("content-type", content_type);
        if let Some(user) = user {
            let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
            request = request.header("authorization", format!("Basic {credentials}"));
        }
        self.client
            .request(request.body(body(payload)).unwrap())
            .await
            .unwrap()
    }

    /// A unary JSON call: the HTTP status and the JSON body.
    async fn unary(&self, method: &str, message: Value) -> (StatusCode, Value) {
        self.unary_as(method, message, None).await
    }

    async fn unary_as(
        &self,
        method: &str,
        message: Value,
        user: Option<&str>,
    ) -> (StatusCode, Value) {
        let response = self
            .post(
                method,
                "application/json",
                user,
                Bytes::from(message.to_string()),
            )
            .await;
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }
}

fn body(bytes: Bytes) -> Body {
    Full::new(bytes).boxed()
}

fn envelope(message: &Value) -> Bytes {
    let payload = message.to_string().into_bytes();
    let mut out = vec![0u8];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&payload);
    Bytes::from(out)
}

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("berth-envd-fs-it-{name}-{}", std::process::id()));
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

/// Server-stream messages read as they arrive.
struct Frames {
    body: Incoming,
    buffer: Vec<u8>,
}

impl Frames {
    /// The next message: `(flags, json)`; panics when the stream stalls.
    async fn next(&mut self) -> (u8, Value) {
        loop {
            if self.buffer.len() >= 5 {
                let len = u32::from_be_bytes(self.buffer[1..5].try_into().unwrap()) as usize;
                if self.buffer.len() >= 5 + len {
                    let flags = self.buffer[0];
                    let message = serde_json::from_slice(&self.buffer[5..5 + len]).unwrap();
                    self.buffer.drain(..5 + len);
                    return (flags, message);
                }
            }
            let frame = tokio::time::timeout(Duration::from_secs(20), self.body.frame())
                .await
                .expect("stream stalled")
                .expect("stream ended")
                .unwrap();
            if let Ok(data) = frame.into_data() {
                self.buffer.extend_from_slice(&data);
            }
        }
    }

    /// Reads filesystem events until one named `name` of `kind` arrives.
    async fn until(&mut self, name: &str, kind: &str) -> Value {
        loop {
            let (flags, message) = self.next().await;
            assert_eq!(flags & 2, 0, "stream ended early: {message}");
            let event = &message["filesystem"];
            if event["name"] == name && event["type"] == kind {
                return event.clone();
            }
        }
    }
}

#[tokio::test]
async fn unary_rpcs_round_trip() {
    let envd = Envd::start().await;
    let dir = TempDir::new("unary");

    let (status, made) = envd
        .unary("MakeDir", json!({"path": dir.path("a/b")}))
        .await;
    assert_eq!(status, StatusCode::OK, "{made}");
    assert_eq!(made["entry"]["type"], "FILE_TYPE_DIRECTORY");
    std::fs::write(dir.path("a/b/f.txt"), b"hello").unwrap();

    let (_, stat) = envd
        .unary("Stat", json!({"path": dir.path("a/b/f.txt")}))
        .await;
    let entry = &stat["entry"];
    assert_eq!(entry["name"], "f.txt");
    assert_eq!(entry["size"], "5");
    assert_eq!(entry["mode"], 0o644);
    assert_eq!(entry["permissions"], "-rw-r--r--");
    assert_eq!(entry["owner"], whoami());

    let (_, listed) = envd
        .unary("ListDir", json!({"path": dir.path("a"), "depth": 2}))
        .await;
    let paths: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, vec![dir.path("a/b"), dir.path("a/b/f.txt")]);

    let (status, moved) = envd
        .unary(
            "Move",
            json!({"source": dir.path("a/b/f.txt"), "destination": dir.path("c/g.txt")}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{moved}");
    assert_eq!(moved["entry"]["path"], dir.path("c/g.txt"));

    let (status, _) = envd.unary("Remove", json!({"path": dir.path("a")})).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!std::path::Path::new(&dir.path("a")).exists());
}

fn whoami() -> String {
    let uid = rustix::process::geteuid().as_raw();
    std::fs::read_to_string("/etc/passwd")
        .unwrap()
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.get(2) == Some(&uid.to_string().as_str())).then(|| fields[0].to_owned())
        })
        .unwrap_or_else(|| uid.to_string())
}

#[tokio::test]
async fn bad_input_gets_the_right_codes() {
    let envd = Envd::start().await;
    let dir = TempDir::new("bad");
    std::fs::write(dir.path("file"), b"").unwrap();
    let cases = [
        ("Stat", json!({"path": dir.path("missing")}), "not_found"),
        ("ListDir", json!({"path": dir.path("missing")}), "not_found"),
        (
            "ListDir",
            json!({"path": dir.path("file")}),
            "invalid_argument",
        ),
        (
            "MakeDir",
            json!({"path": dir.path("file")}),
            "invalid_argument",
        ),
        (
            "MakeDir",
            json!({"path": dir.0.to_str().unwrap()}),
            "already_exists",
        ),
        (
            "Move",
            json!({"source": dir.path("missing"), "destination": dir.path("x")}),
            "not_found",
        ),
        ("Stat", json!({"path": "~nobody/x"}), "invalid_argument"),
        (
            "GetWatcherEvents",
            json!({"watcherId": "wnope"}),
            "not_found",
        ),
        ("RemoveWatcher", json!({"watcherId": "wnope"}), "not_found"),
        (
            "CreateWatcher",
            json!({"path": dir.path("file")}),
            "invalid_argument",
        ),
    ];
    for (method, message, code) in cases {
        let (status, body) = envd.unary(method, message.clone()).await;
        assert_eq!(body["code"], code, "{method} {message}: {status} {body}");
    }
    let (status, body) = envd
        .unary_as(
            "Stat",
            json!({"path": dir.path("file")}),
            Some("no-such-user"),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["code"], "unauthenticated");
    // The message names the path.
    let (_, body) = envd
        .unary("Stat", json!({"path": dir.path("missing")}))
        .await;
    assert!(body["message"]
        .as_str()
        .unwrap()
        .contains(&dir.path("missing")));
}

#[tokio::test]
async fn watch_dir_streams_events_recursively() {
    let envd = Envd::start().await;
    let dir = TempDir::new("watch");
    let response = envd
        .post(
            "WatchDir",
            "application/connect+json",
            None,
            envelope(
                &json!({"path": dir.0.to_str().unwrap(), "recursive": true, "includeEntry": true}),
            ),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let mut frames = Frames {
        body: response.into_body(),
        buffer: Vec::new(),
    };
    assert_eq!(frames.next().await, (0, json!({"start": {}})));

    std::fs::create_dir(dir.path("sub")).unwrap();
    let created = frames.until("sub", "EVENT_TYPE_CREATE").await;
    assert_eq!(created["entry"]["type"], "FILE_TYPE_DIRECTORY");
    std::fs::write(dir.path("sub/f"), b"1").unwrap();
    frames.until("sub/f", "EVENT_TYPE_WRITE").await;
    std::fs::set_permissions(
        dir.path("sub/f"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    frames.until("sub/f", "EVENT_TYPE_CHMOD").await;
    std::fs::rename(dir.path("sub/f"), dir.path("sub/g")).unwrap();
    frames.until("sub/f", "EVENT_TYPE_RENAME").await;
    frames.until("sub/g", "EVENT_TYPE_CREATE").await;
    std::fs::remove_file(dir.path("sub/g")).unwrap();
    let removed = frames.until("sub/g", "EVENT_TYPE_REMOVE").await;
    assert!(
        removed.get("entry").is_none(),
        "a removed entry has no info: {removed}"
    );
}

#[tokio::test]
async fn polling_watcher_collects_and_is_removed() {
    let envd = Envd::start().await;
    let dir = TempDir::new("poll");
    let (status, created) = envd
        .unary("CreateWatcher", json!({"path": dir.0.to_str().unwrap()}))
        .await;
    assert_eq!(status, StatusCode::OK, "{created}");
    let id = created["watcherId"].as_str().unwrap().to_owned();
    std::fs::write(dir.path("polled"), b"x").unwrap();
    let mut events = Vec::new();
    for _ in 0..400 {
        let (_, got) = envd
            .unary("GetWatcherEvents", json!({"watcherId": id}))
            .await;
        events.extend(got["events"].as_array().cloned().unwrap_or_default());
        if events
            .iter()
            .any(|e| e["name"] == "polled" && e["type"] == "EVENT_TYPE_CREATE")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        events
            .iter()
            .any(|e| e["name"] == "polled" && e["type"] == "EVENT_TYPE_CREATE"),
        "{events:?}"
    );
    let (status, _) = envd.unary("RemoveWatcher", json!({"watcherId": id})).await;
    assert_eq!(status, StatusCode::OK);
    let (_, gone) = envd
        .unary("GetWatcherEvents", json!({"watcherId": id}))
        .await;
    assert_eq!(gone["code"], "not_found");
}
