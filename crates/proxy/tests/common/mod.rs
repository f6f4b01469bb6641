//! A real front server mounting the proxy on 127.0.0.1, a real upstream HTTP server
//! standing in for a sandbox's ports, and a resolver that dials it.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;
use berth_envd_proto::ENVD_PORT;
use berth_proxy::{
    BoxFuture, PortConnector, Proxy, ResolveError, Route, RoutingConfig, SandboxConnections,
    SandboxId, SandboxResolver,
};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

/// The user port the upstream serves besides envd's.
pub const USER_PORT: u16 = 8080;

/// Observations and controls shared between the upstream server and the test.
#[derive(Default)]
pub struct UpstreamState {
    /// Released by the test once it has seen the first chunk of `/stream`.
    pub release_second_chunk: Notify,
    /// Bytes received so far by `/upload`, reported after each chunk.
    pub upload_progress: Mutex<Option<mpsc::UnboundedSender<u64>>>,
    /// Requests that reached `/init` on the upstream (must stay 0).
    pub internal_hits: AtomicUsize,
}

/// Upstream server, front server and resolver, all stopped on drop.
pub struct Harness {
    pub front: SocketAddr,
    pub upstream: Arc<UpstreamState>,
    /// Connections the proxy opened into the "sandbox".
    pub connects: Arc<AtomicUsize>,
    /// The proxy's connections, as the server holds them.
    pub connections: SandboxConnections,
    /// Where the process standing in for the sandbox's ports listens.
    pub upstream_address: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Sandboxes the resolver knows.
#[derive(Clone)]
pub struct KnownSandbox {
    pub id: &'static str,
    pub envd_access_token: Option<&'static str>,
    pub traffic_access_token: Option<&'static str>,
    pub allow_public_traffic: bool,
}

pub const OPEN_SANDBOX: KnownSandbox = KnownSandbox {
    id: "iopen",
    envd_access_token: None,
    traffic_access_token: None,
    allow_public_traffic: true,
};
pub const SECURE_SANDBOX: KnownSandbox = KnownSandbox {
    id: "isecure",
    envd_access_token: Some("envd-secret"),
    traffic_access_token: Some("traffic-secret"),
    allow_public_traffic: false,
};

struct Dialer {
    /// Sandbox port → address of the process standing in for it.
    ports: HashMap<u16, SocketAddr>,
    /// Address with no listener, so unmapped ports are refused by the kernel.
    closed: SocketAddr,
    connects: Arc<AtomicUsize>,
}

impl PortConnector for Dialer {
    fn connect(&self, port: u16) -> BoxFuture<'_, io::Result<TcpStream>> {
        let address = self.ports.get(&port).copied().unwrap_or(self.closed);
        self.connects.fetch_add(1, Ordering::SeqCst);
        Box::pin(TcpStream::connect(address))
    }
}

struct Resolver {
    sandboxes: Vec<KnownSandbox>,
    dialer: Arc<Dialer>,
}

impl SandboxResolver for Resolver {
    fn resolve<'a>(
        &'a self,
        sandbox_id: &'a SandboxId,
    ) -> BoxFuture<'a, Result<Route, ResolveError>> {
        Box::pin(async move {
            let known = self
                .sandboxes
                .iter()
                .find(|known| known.id == sandbox_id.as_str())
                .ok_or(ResolveError::NotFound)?;
            Ok(Route {
                connector: self.dialer.clone(),
                envd_access_token: known.envd_access_token.map(str::to_owned),
                traffic_access_token: known.traffic_access_token.map(str::to_owned),
                allow_public_traffic: known.allow_public_traffic,
                mask_request_host: None,
            })
        })
    }

    fn is_gone<'a>(&'a self, sandbox_id: &'a SandboxId) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            !self
                .sandboxes
                .iter()
                .any(|known| known.id == sandbox_id.as_str())
        })
    }

    fn file_signers(&self) -> BoxFuture<'_, Result<Vec<(SandboxId, String)>, ResolveError>> {
        Box::pin(async move {
            Ok(self
                .sandboxes
                .iter()
                .filter_map(|known| {
                    let token = known.envd_access_token?;
                    Some((SandboxId::parse(known.id).ok()?, token.to_owned()))
                })
                .collect())
        })
    }
}

pub async fn start() -> Harness {
    let upstream_state = Arc::new(UpstreamState::default());
    let app = Router::new()
        .route("/stream", get(stream))
        .route("/upload", post(upload))
        .route("/full", post(disk_full))
        .route("/echo", any(echo))
        .route("/files", any(echo))
        .route("/ws", get(websocket))
        .route("/init", any(internal))
        .route("/close", get(closing))
        .with_state(upstream_state.clone());
    let upstream_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_address = upstream_listener.local_addr().unwrap();
    let upstream_task = tokio::spawn(async move {
        axum::serve(upstream_listener, app).await.unwrap();
    });

    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let connects = Arc::new(AtomicUsize::new(0));
    let dialer = Arc::new(Dialer {
        ports: HashMap::from([(ENVD_PORT, upstream_address), (USER_PORT, upstream_address)]),
        closed,
        connects: connects.clone(),
    });
    let resolver = Resolver {
        sandboxes: vec![OPEN_SANDBOX, SECURE_SANDBOX],
        dialer,
    };
    let connections = SandboxConnections::default();
    let proxy = Proxy::with_connections(
        Arc::new(resolver),
        RoutingConfig {
            domain: Some("berth.test".to_owned()),
        },
        connections.clone(),
    );

    let front_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = front_listener.local_addr().unwrap();
    let front_task = tokio::spawn(async move {
        loop {
            let (socket, _) = front_listener.accept().await.unwrap();
            let proxy = proxy.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let proxy = proxy.clone();
                    async move { Ok::<_, std::convert::Infallible>(proxy.handle(req).await) }
                });
                // Mirrors the server: one listener, HTTP/1.1 and h2c, upgrades allowed.
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(socket), service)
                    .await;
            });
        }
    });

    Harness {
        front,
        upstream: upstream_state,
        connects,
        connections,
        upstream_address,
        tasks: vec![upstream_task, front_task],
    }
}

async fn stream(State(state): State<Arc<UpstreamState>>) -> Response {
    let chunks = futures::stream::unfold(0u8, move |step| {
        let state = state.clone();
        async move {
            match step {
                0 => Some((Ok::<_, io::Error>(Bytes::from_static(b"first")), 1)),
                1 => {
                    state.release_second_chunk.notified().await;
                    Some((Ok(Bytes::from_static(b"second")), 2))
                }
                _ => None,
            }
        }
    });
    Body::from_stream(chunks).into_response()
}

async fn upload(State(state): State<Arc<UpstreamState>>, request: Request) -> String {
    let progress = state.upload_progress.lock().unwrap().clone();
    let mut body = request.into_body().into_data_stream();
    let mut received = 0u64;
    while let Some(chunk) = body.next().await {
        received += chunk.unwrap().len() as u64;
        if let Some(progress) = &progress {
            let _ = progress.send(received);
        }
    }
    received.to_string()
}

/// envd's answer to an upload that fills the disk: after the first chunk, a 507 at once,
/// while the rest of the body is read and discarded in the background (as envd does).
async fn disk_full(request: Request) -> Response {
    let mut body = request.into_body().into_data_stream();
    let _ = body.next().await;
    tokio::spawn(async move { while body.next().await.is_some() {} });
    (
        http::StatusCode::INSUFFICIENT_STORAGE,
        axum::Json(serde_json::json!({"code": 507, "message": "not enough disk space available"})),
    )
        .into_response()
}

/// Answers with what arrived: method, path and query, and headers.
async fn echo(request: Request) -> axum::Json<serde_json::Value> {
    let headers: serde_json::Map<String, serde_json::Value> = request
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes())
                    .into_owned()
                    .into(),
            )
        })
        .collect();
    let method = request.method().to_string();
    let uri = request.uri().to_string();
    let body = request.into_body().collect().await.unwrap().to_bytes();
    axum::Json(serde_json::json!({
        "method": method,
        "uri": uri,
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
    }))
}

async fn websocket(upgrade: WebSocketUpgrade) -> Response {
    upgrade.on_upgrade(|mut socket: WebSocket| async move {
        while let Some(Ok(message)) = socket.recv().await {
            let reply = match message {
                Message::Text(text) => Message::Text(format!("echo:{}", text.as_str()).into()),
                Message::Binary(data) => Message::Binary(data),
                Message::Close(_) => break,
                _ => continue,
            };
            if socket.send(reply).await.is_err() {
                break;
            }
        }
    })
}

/// Answers and asks for the connection to be closed, as HTTP/1.0-style servers do.
async fn closing() -> Response {
    ([(http::header::CONNECTION, "close")], "closing").into_response()
}

async fn internal(State(state): State<Arc<UpstreamState>>) -> &'static str {
    state.internal_hits.fetch_add(1, Ordering::SeqCst);
    "internal route reached"
}

type TestBody = http_body_util::combinators::UnsyncBoxBody<Bytes, berth_proxy::BoxError>;

/// An HTTP/1.1 client connection to the front server.
pub struct Http1Client {
    sender: hyper::client::conn::http1::SendRequest<TestBody>,
}

impl Http1Client {
    /// Sends once the connection can take a request (the previous response may
    /// still be finishing inside hyper even after its body was read).
    pub async fn send_request(
        &mut self,
        request: http::Request<TestBody>,
    ) -> Result<http::Response<hyper::body::Incoming>, hyper::Error> {
        self.sender.ready().await?;
        self.sender.send_request(request).await
    }
}

pub async fn http1_client(front: SocketAddr) -> Http1Client {
    let stream = TcpStream::connect(front).await.unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Http1Client { sender }
}

/// A request body from a fixed byte string.
pub fn full_body(
    bytes: impl Into<Bytes>,
) -> http_body_util::combinators::UnsyncBoxBody<Bytes, berth_proxy::BoxError> {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Collects a response into its status and JSON body.
pub async fn json_of(
    response: http::Response<hyper::body::Incoming>,
) -> (http::StatusCode, serde_json::Value) {
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&body)));
    (status, json)
}
