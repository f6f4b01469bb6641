//! Talking to a sandbox's envd from the host, over a connection the runtime opens in the
//! sandbox's network namespace: wait for `/health`, then `POST /init`. Each connection
//! that answered is left to the proxy's pool ([`SandboxConnections::send_and_keep`]), so
//! the client's first call after a create, resume or fork does not connect into the
//! sandbox again, and a call finding one kept takes it: a warm-pool sandbox's claim
//! sends `/init` over the connection its preparation's `/health` left.

use std::sync::Arc;
use std::time::Duration;

use berth_envd_proto::headers::ACCESS_TOKEN;
pub use berth_envd_proto::http::InitRequest;
use berth_envd_proto::ENVD_PORT;
use berth_proxy::{DirectRequestError, SandboxConnections};
use berth_runtime::{Runtime, RuntimeError};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use tokio::time::Instant;

/// How long a new sandbox's envd may take to answer `/health`.
pub(crate) const READY_LIMIT: Duration = Duration::from_secs(30);

/// Longest wait for envd's answer to `/init`.
const INIT_LIMIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum EnvdError {
    #[error("envd did not become healthy within {limit:?} (last attempt: {last})")]
    NotReady { limit: Duration, last: String },
    #[error("opening a connection to envd: {0}")]
    Connect(#[from] RuntimeError),
    #[error("talking to envd: {0}")]
    Io(#[from] std::io::Error),
    #[error("talking to envd: {0}")]
    Http(#[from] hyper::Error),
    #[error("talking to envd: {0}")]
    Direct(#[from] DirectRequestError),
    #[error("building a request to envd: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("encoding the /init body: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("the connect worker failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("no answer to /init within {0:?}")]
    InitTimeout(Duration),
    #[error("envd answered {status} to {route}: {body}")]
    Status {
        route: &'static str,
        status: u16,
        body: String,
    },
}

/// `build`'s request to envd, over a connection kept from an earlier call when one is
/// open (a pooled sandbox's `/health` leaves one for its claim's `/init`), else over a
/// new one. Any failure on a kept connection is retried once on a new connection: both
/// of the requests sent here (`/health`, `/init`) may be repeated.
async fn request(
    runtime: &Arc<dyn Runtime>,
    connections: &SandboxConnections,
    sandbox_id: &str,
    build: impl Fn() -> Result<Request<Full<Bytes>>, hyper::http::Error>,
) -> Result<(u16, Bytes), EnvdError> {
    let boxed = |request: Request<Full<Bytes>>| {
        request.map(|body| body.map_err(|never| match never {}).boxed_unsync())
    };
    if let Some(sent) = connections
        .send_on_kept(sandbox_id, ENVD_PORT, boxed(build()?))
        .await
    {
        match read_answer(sent).await {
            Ok(answer) => return Ok(answer),
            Err(err) => {
                tracing::debug!(sandbox = sandbox_id, %err, "a kept connection to envd failed; opening a new one")
            }
        }
    }
    let runtime = runtime.clone();
    let id = sandbox_id.to_string();
    let stream = tokio::task::spawn_blocking(move || runtime.connect(&id, ENVD_PORT)).await??;
    stream.set_nonblocking(true)?;
    let stream = tokio::net::TcpStream::from_std(stream)?;
    let sent = connections
        .send_and_keep(sandbox_id, ENVD_PORT, stream, boxed(build()?))
        .await;
    read_answer(sent).await
}

/// The status and whole body of envd's answer.
async fn read_answer(
    sent: Result<hyper::Response<berth_proxy::ProxyBody>, DirectRequestError>,
) -> Result<(u16, Bytes), EnvdError> {
    let response = sent?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    Ok((status, body))
}

/// Poll envd's `/health` until it answers 204, or give up after `limit`.
pub async fn wait_healthy(
    runtime: &Arc<dyn Runtime>,
    connections: &SandboxConnections,
    sandbox_id: &str,
    limit: Duration,
) -> Result<(), EnvdError> {
    let deadline = Instant::now() + limit;
    // Short first waits: envd usually listens within milliseconds of the init exec.
    let mut pause = Duration::from_millis(1);
    loop {
        let health = || {
            Request::get("/health")
                .header("host", "localhost")
                .body(Full::new(Bytes::new()))
        };
        // Each attempt is bounded too: a connection that is accepted but never answered
        // must not stall the create past its limit.
        let attempt =
            tokio::time::timeout_at(deadline, request(runtime, connections, sandbox_id, health))
                .await;
        let last = match attempt {
            Ok(Ok((204, _))) => return Ok(()),
            // The sandbox itself is gone: no point waiting.
            Ok(Err(EnvdError::Connect(RuntimeError::NotFound(id)))) => {
                return Err(EnvdError::Connect(RuntimeError::NotFound(id)))
            }
            Ok(Ok((status, _))) => format!("/health answered {status}"),
            Ok(Err(err)) => err.to_string(),
            Err(_) => "no answer".to_string(),
        };
        if Instant::now() + pause > deadline {
            return Err(EnvdError::NotReady { limit, last });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Hand envd its access token, environment and default user/workdir.
pub async fn init(
    runtime: &Arc<dyn Runtime>,
    connections: &SandboxConnections,
    sandbox_id: &str,
    body: &InitRequest,
    presented_token: Option<&str>,
) -> Result<(), EnvdError> {
    let json = Bytes::from(serde_json::to_vec(body)?);
    // An envd restored from a checkpoint wants the token it holds; a fresh one has none
    // and takes the new token without one.
    let token = presented_token.or(body.access_token.as_deref());
    let init = || {
        let mut builder = Request::post("/init")
            .header("host", "localhost")
            .header("content-type", "application/json");
        if let Some(token) = token {
            builder = builder.header(ACCESS_TOKEN, token);
        }
        builder.body(Full::new(json.clone()))
    };
    let (status, reply) =
        tokio::time::timeout(INIT_LIMIT, request(runtime, connections, sandbox_id, init))
            .await
            .map_err(|_| EnvdError::InitTimeout(INIT_LIMIT))??;
    if !(200..300).contains(&status) {
        return Err(EnvdError::Status {
            route: "/init",
            status,
            body: String::from_utf8_lossy(&reply).into_owned(),
        });
    }
    Ok(())
}
