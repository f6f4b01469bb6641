//! Forwarding one request to a sandbox port and streaming the answer back.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

use berth_envd_proto::headers::{ACCESS_TOKEN, SANDBOX_ID, SANDBOX_PORT};
use berth_envd_proto::signature::constant_time_eq;
use berth_envd_proto::ENVD_PORT;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::TokioIo;

use crate::pool::{ConnectionPool, PooledBody, Sender};
use crate::resolver::{ResolveError, Route, SandboxResolver};
use crate::signed::{SignatureError, SignedFileUrl};
use crate::target::{
    is_internal_envd_route, Addressing, RoutingConfig, SandboxId, Target, TargetError,
};
use tokio_util::sync::CancellationToken;

/// Boxed error of streamed bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Body of every response the proxy produces: the sandbox's own body streamed
/// through, or a small JSON error.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Header carrying the traffic access token for user ports.
pub const TRAFFIC_ACCESS_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), plus `Expect`
/// because the proxy's server side already answers `100 Continue` itself.
const HOP_BY_HOP_HEADERS: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::EXPECT,
];

/// Why [`SandboxConnections::send_and_keep`] got no answer.
#[derive(Debug, thiserror::Error)]
pub enum DirectRequestError {
    #[error("{0:?} is not a sandbox id")]
    InvalidSandboxId(String),
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

/// Why a request could not be forwarded; each maps to one HTTP answer.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("not a sandbox request")]
    NotSandboxRequest,
    #[error(transparent)]
    InvalidTarget(#[from] TargetError),
    #[error("{path} is an internal envd route, not reachable through the proxy")]
    InternalRoute { path: String },
    #[error("the sandbox was not found")]
    SandboxNotFound { sandbox_id: SandboxId },
    #[error("the sandbox is running but port {port} is not open")]
    PortNotOpen { sandbox_id: SandboxId, port: u16 },
    #[error("missing or invalid envd access token (X-Access-Token)")]
    EnvdAccessDenied,
    #[error("missing or invalid traffic access token (e2b-traffic-access-token)")]
    TrafficAccessDenied,
    #[error(transparent)]
    Signature(#[from] SignatureError),
    #[error("sandbox lookup failed: {0}")]
    Lookup(String),
    #[error("connecting to the sandbox failed: {source}")]
    Connect {
        sandbox_id: SandboxId,
        source: io::Error,
    },
    #[error("the sandbox's answer failed: {source}")]
    Upstream {
        sandbox_id: SandboxId,
        source: hyper::Error,
    },
}

impl ProxyError {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::NotSandboxRequest => StatusCode::NOT_FOUND,
            Self::InvalidTarget(_) => StatusCode::BAD_REQUEST,
            Self::InternalRoute { .. } | Self::TrafficAccessDenied => StatusCode::FORBIDDEN,
            Self::EnvdAccessDenied | Self::Signature(_) => StatusCode::UNAUTHORIZED,
            Self::Lookup(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::SandboxNotFound { .. }
            | Self::PortNotOpen { .. }
            | Self::Connect { .. }
            | Self::Upstream { .. } => StatusCode::BAD_GATEWAY,
        }
    }

    /// The JSON answer: `{code, message}` plus `sandboxId` (and `port`) for 502s, in
    /// the shape the SDKs recognise.
    pub fn into_response(self) -> Response<ProxyBody> {
        let status = self.status();
        let mut body = serde_json::json!({
            "code": status.as_u16(),
            "message": self.client_message(),
        });
        match &self {
            Self::SandboxNotFound { sandbox_id }
            | Self::Connect { sandbox_id, .. }
            | Self::Upstream { sandbox_id, .. } => {
                body["sandboxId"] = sandbox_id.as_str().into();
            }
            Self::PortNotOpen { sandbox_id, port } => {
                body["sandboxId"] = sandbox_id.as_str().into();
                body["port"] = (*port).into();
            }
            _ => {}
        }
        json_response(status, &body)
    }

    fn client_message(&self) -> String {
        match self {
            // The SDKs match on these exact phrases ("was not found", "port is not open").
            Self::SandboxNotFound { .. } => "The sandbox was not found".to_owned(),
            Self::PortNotOpen { port, .. } => {
                format!("The sandbox is running but port is not open (port {port})")
            }
            Self::Lookup(_) => "sandbox lookup failed".to_owned(),
            other => {
                let text = other.to_string();
                let mut chars = text.chars();
                chars
                    .next()
                    .map(|first| first.to_uppercase().chain(chars).collect())
                    .unwrap_or_default()
            }
        }
    }
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<ProxyBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// What came of sending a request over the connections kept for a sandbox port.
enum OnKept {
    Answered(Response<ProxyBody>),
    /// It went out and failed: whether the sandbox saw it is unknown.
    Failed(hyper::Error),
    /// No kept connection was open; the request, unsent.
    NoneOpen(Request<ProxyBody>),
}

/// Every connection the proxy holds into sandboxes, idle or busy, so that all of one
/// sandbox's can be closed at once (when it pauses: its end of them is gone, and a
/// client stream through them must end instead of hanging). Cheap to clone.
#[derive(Clone, Default)]
pub struct SandboxConnections {
    pool: ConnectionPool,
    /// Connections opened and open, bytes each way.
    counters: Arc<crate::stats::Counters>,
    /// Cancelled (and replaced) to close every open connection of a sandbox.
    closers: Arc<Mutex<HashMap<SandboxId, CancellationToken>>>,
}

impl SandboxConnections {
    /// Totals of the connections into sandboxes since the proxy started.
    pub fn stats(&self) -> crate::ProxyStats {
        self.counters.read()
    }

    /// Closes every connection into sandbox `sandbox_id`: idle ones are dropped, busy
    /// ones end (their responses end early, tunnels close).
    pub fn close_all(&self, sandbox_id: &str) {
        let Ok(id) = SandboxId::parse(sandbox_id) else {
            return;
        };
        self.pool.forget(&id);
        let closer = self
            .closers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&id);
        if let Some(closer) = closer {
            closer.cancel();
        }
    }

    /// Cancelled when [`SandboxConnections::close_all`] closes sandbox `sandbox_id`'s
    /// connections: for connections into it made outside this proxy (a node's tunnel
    /// ends) that must end with the others. None for an invalid id.
    pub fn closing(&self, sandbox_id: &str) -> Option<CancellationToken> {
        SandboxId::parse(sandbox_id).ok().map(|id| self.closer(&id))
    }

    /// Sends `request` over `stream`, a connection the caller opened to `port` of
    /// sandbox `sandbox_id`, and keeps the connection for the proxy once the answer's
    /// body has been read to its end: the server's own last call into a sandbox it
    /// brings up (envd's `/init`) leaves the connection that the client's first call
    /// through the proxy then takes, instead of connecting into the sandbox again.
    pub async fn send_and_keep(
        &self,
        sandbox_id: &str,
        port: u16,
        stream: tokio::net::TcpStream,
        request: Request<ProxyBody>,
    ) -> Result<Response<ProxyBody>, DirectRequestError> {
        let id = SandboxId::parse(sandbox_id)
            .map_err(|_| DirectRequestError::InvalidSandboxId(sandbox_id.to_owned()))?;
        let mut sender = attach(stream, &id, false, self).await?;
        let response = sender.send_request(request).await?;
        Ok(self.keep_after(response, id, port, sender))
    }

    /// Sends `request` over an idle connection kept for `port` of sandbox `sandbox_id`
    /// (by an earlier [`SandboxConnections::send_and_keep`] or proxied request), and
    /// keeps that connection again once the answer's body has been read to its end.
    /// `None` when no kept connection is open: the caller opens one. A request that
    /// fails on a kept connection may or may not have reached the sandbox, so only
    /// callers whose request can be repeated should retry on a new connection.
    pub async fn send_on_kept(
        &self,
        sandbox_id: &str,
        port: u16,
        request: Request<ProxyBody>,
    ) -> Option<Result<Response<ProxyBody>, DirectRequestError>> {
        let id = SandboxId::parse(sandbox_id).ok()?;
        match self.send_kept(&id, port, request).await {
            OnKept::Answered(response) => Some(Ok(response)),
            OnKept::Failed(source) => Some(Err(source.into())),
            OnKept::NoneOpen(_) => None,
        }
    }

    /// `request` over the kept connections to `port` of sandbox `id`, one after another
    /// while they turn out closed before a byte of it went out.
    async fn send_kept(
        &self,
        id: &SandboxId,
        port: u16,
        mut request: Request<ProxyBody>,
    ) -> OnKept {
        loop {
            let Some(mut sender) = self.pool.take(id, port) else {
                return OnKept::NoneOpen(request);
            };
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => {
                    return OnKept::Answered(self.keep_after(response, id.clone(), port, sender))
                }
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) => request = unsent,
                    None => return OnKept::Failed(failed.into_error()),
                },
            }
        }
    }

    /// `response`, whose body hands `sender` back to the pool once read to its end.
    fn keep_after(
        &self,
        response: Response<hyper::body::Incoming>,
        id: SandboxId,
        port: u16,
        sender: Sender,
    ) -> Response<ProxyBody> {
        response.map(|body| {
            PooledBody::new(body, self.pool.clone(), id, port, sender)
                .map_err(BoxError::from)
                .boxed_unsync()
        })
    }

    fn closer(&self, sandbox_id: &SandboxId) -> CancellationToken {
        self.closers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(sandbox_id.clone())
            .or_default()
            .clone()
    }
}

/// The sandbox proxy. Cheap to clone; mount it in front of the API and send every
/// request that [`Proxy::classify`] claims to [`Proxy::forward`].
#[derive(Clone)]
pub struct Proxy {
    resolver: Arc<dyn SandboxResolver>,
    routing: RoutingConfig,
    pool: ConnectionPool,
    connections: SandboxConnections,
}

impl Proxy {
    pub fn new(resolver: Arc<dyn SandboxResolver>, routing: RoutingConfig) -> Self {
        Self::with_connections(resolver, routing, SandboxConnections::default())
    }

    /// A proxy whose connections `connections` can close (see
    /// [`SandboxConnections::close_all`]).
    pub fn with_connections(
        resolver: Arc<dyn SandboxResolver>,
        routing: RoutingConfig,
        connections: SandboxConnections,
    ) -> Self {
        Self {
            resolver,
            routing,
            pool: connections.pool.clone(),
            connections,
        }
    }

    /// See [`RoutingConfig::classify`].
    pub fn classify<B>(&self, req: &Request<B>) -> Option<Result<Target, TargetError>> {
        self.routing.classify(req)
    }

    /// Classifies and forwards (signed file URLs included); errors become their JSON
    /// answers.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        match self.classify(&req) {
            None => match SignedFileUrl::from_request(&req) {
                Some(signed) => self.forward_signed(req, signed).await,
                None => ProxyError::NotSandboxRequest.into_response(),
            },
            Some(Err(error)) => ProxyError::from(error).into_response(),
            Some(Ok(target)) => self.forward(req, target).await,
        }
    }

    /// Forwards `req` to `target`; errors become their JSON answers.
    pub async fn forward<B>(&self, req: Request<B>, target: Target) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        match self.try_forward(req, target).await {
            Ok(response) => response,
            Err(error) => {
                tracing::debug!(%error, "sandbox proxy refused or failed a request");
                error.into_response()
            }
        }
    }

    /// Forwards a signed file URL that names no sandbox to the sandbox whose token signed
    /// it (see the `signed` module); errors become their JSON answers. A signature no
    /// sandbox signed is refused the same way whether or not any sandbox exists.
    pub async fn forward_signed<B>(
        &self,
        req: Request<B>,
        signed: Result<SignedFileUrl, SignatureError>,
    ) -> Response<ProxyBody>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let target = async {
            let signed = signed?;
            let signers = self
                .resolver
                .file_signers()
                .await
                .map_err(|error| match error {
                    ResolveError::NotFound => ProxyError::Signature(SignatureError::Invalid),
                    ResolveError::Lookup(message) => ProxyError::Lookup(message),
                })?;
            let sandbox_id = signed.signer(&signers).ok_or(SignatureError::Invalid)?;
            signed.check_expiration(unix_now())?;
            Ok::<_, ProxyError>(Target {
                sandbox_id,
                port: ENVD_PORT,
                addressing: Addressing::Signature,
                path_and_query: signed.path_and_query,
            })
        };
        match target.await {
            Ok(target) => self.forward(req, target).await,
            Err(error) => {
                tracing::debug!(%error, "sandbox proxy refused a signed file URL");
                error.into_response()
            }
        }
    }

    /// Forwards `req` to `target`, streaming the request body up and the response
    /// body down as they flow; `Upgrade` requests become a two-way byte tunnel.
    pub async fn try_forward<B>(
        &self,
        mut req: Request<B>,
        target: Target,
    ) -> Result<Response<ProxyBody>, ProxyError>
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        if target.port == ENVD_PORT && is_internal_envd_route(target.path()) {
            return Err(ProxyError::InternalRoute {
                path: target.path().to_owned(),
            });
        }
        let route =
            self.resolver
                .resolve(&target.sandbox_id)
                .await
                .map_err(|error| match error {
                    ResolveError::NotFound => {
                        self.pool.forget(&target.sandbox_id);
                        ProxyError::SandboxNotFound {
                            sandbox_id: target.sandbox_id.clone(),
                        }
                    }
                    ResolveError::Lookup(message) => ProxyError::Lookup(message),
                })?;
        authorize(req.headers(), &target, &route)?;

        let client_upgrade = is_upgrade_request(&req).then(|| hyper::upgrade::on(&mut req));
        let upstream_request = upstream_request(req, &target, &route, client_upgrade.is_some());
        let forwarded = match client_upgrade {
            Some(client_upgrade) => {
                self.forward_upgrade(upstream_request, client_upgrade, &route, &target)
                    .await
            }
            None => self.forward_pooled(upstream_request, &route, &target).await,
        };
        match forwarded {
            Err(
                error @ (ProxyError::Connect { .. }
                | ProxyError::Upstream { .. }
                | ProxyError::PortNotOpen { .. }),
            ) => Err(self.gone_or(error, &target.sandbox_id).await),
            other => other,
        }
    }

    /// A request that failed inside the sandbox may have met its end: for a sandbox
    /// killed meanwhile "not found" says so, where the failed connection would leave
    /// its state unknown.
    async fn gone_or(&self, error: ProxyError, sandbox_id: &SandboxId) -> ProxyError {
        if !self.resolver.is_gone(sandbox_id).await {
            return error;
        }
        self.pool.forget(sandbox_id);
        ProxyError::SandboxNotFound {
            sandbox_id: sandbox_id.clone(),
        }
    }

    /// Sends a plain request over an idle pooled connection when one is left, else a
    /// new one. A pooled connection that turns out closed before the request left is
    /// dropped and the request retried; once sent, a failure is the answer.
    async fn forward_pooled(
        &self,
        request: Request<ProxyBody>,
        route: &Route,
        target: &Target,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let kept = self
            .connections
            .send_kept(&target.sandbox_id, target.port, request)
            .await;
        let mut response = match kept {
            OnKept::Answered(response) => response,
            OnKept::Failed(source) => return Err(upstream_error(target, source)),
            OnKept::NoneOpen(request) => {
                let mut sender = open_connection(route, target, false, &self.connections).await?;
                let sent = match sender.ready().await {
                    Ok(()) => sender.send_request(request).await,
                    Err(source) => Err(source),
                };
                let response = sent.map_err(|source| upstream_error(target, source))?;
                self.connections.keep_after(
                    response,
                    target.sandbox_id.clone(),
                    target.port,
                    sender,
                )
            }
        };
        remove_hop_by_hop_headers(response.headers_mut());
        Ok(response)
    }

    /// Sends an `Upgrade` request on a connection of its own and, on `101`, joins the
    /// client's and the sandbox's upgraded connections into a byte tunnel.
    async fn forward_upgrade(
        &self,
        request: Request<ProxyBody>,
        client_upgrade: hyper::upgrade::OnUpgrade,
        route: &Route,
        target: &Target,
    ) -> Result<Response<ProxyBody>, ProxyError> {
        let mut sender = open_connection(route, target, true, &self.connections).await?;
        let mut response = sender
            .send_request(request)
            .await
            .map_err(|source| upstream_error(target, source))?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            remove_hop_by_hop_headers(response.headers_mut());
            return Ok(response.map(|body| body.map_err(BoxError::from).boxed_unsync()));
        }
        let upstream_upgrade = hyper::upgrade::on(&mut response);
        let sandbox_id = target.sandbox_id.clone();
        let closer = self.connections.closer(&target.sandbox_id);
        tokio::spawn(async move {
            tokio::select! {
                result = tunnel(client_upgrade, upstream_upgrade) => if let Err(error) = result {
                    tracing::debug!(%sandbox_id, %error, "upgraded connection ended with an error");
                },
                () = closer.cancelled() => {
                    tracing::debug!(%sandbox_id, "upgraded connection closed: the sandbox paused");
                }
            }
        });
        let (parts, _) = response.into_parts();
        Ok(Response::from_parts(parts, empty_body()))
    }
}

fn upstream_error(target: &Target, source: hyper::Error) -> ProxyError {
    ProxyError::Upstream {
        sandbox_id: target.sandbox_id.clone(),
        source,
    }
}

/// Classifies a connector failure. ESRCH counts as "not found": entering the network
/// namespace of a sandbox whose init has exited fails with it.
fn connect_error(target: &Target, source: io::Error) -> ProxyError {
    if source.kind() == io::ErrorKind::ConnectionRefused {
        return ProxyError::PortNotOpen {
            sandbox_id: target.sandbox_id.clone(),
            port: target.port,
        };
    }
    if source.kind() == io::ErrorKind::NotFound || source.raw_os_error() == Some(libc::ESRCH) {
        return ProxyError::SandboxNotFound {
            sandbox_id: target.sandbox_id.clone(),
        };
    }
    ProxyError::Connect {
        sandbox_id: target.sandbox_id.clone(),
        source,
    }
}

/// Opens a new HTTP/1.1 connection to the target port through the route's connector.
async fn open_connection(
    route: &Route,
    target: &Target,
    with_upgrades: bool,
    connections: &SandboxConnections,
) -> Result<Sender, ProxyError> {
    let stream = route
        .connector
        .connect(target.port)
        .await
        .map_err(|source| connect_error(target, source))?;
    attach(stream, &target.sandbox_id, with_upgrades, connections)
        .await
        .map_err(|source| upstream_error(target, source))
}

/// Makes `stream`, connected to a port of sandbox `sandbox_id`, one of the proxy's
/// HTTP/1.1 connections: counted, driven by a task of its own, closed with the
/// sandbox's others.
async fn attach(
    stream: tokio::net::TcpStream,
    sandbox_id: &SandboxId,
    with_upgrades: bool,
    connections: &SandboxConnections,
) -> Result<Sender, hyper::Error> {
    // Nagle would hold back the small frames of Connect streams.
    stream.set_nodelay(true).ok();
    let stream = crate::stats::Counted::new(stream, connections.counters.clone());
    let (sender, connection) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await?;
    let closer = connections.closer(sandbox_id);
    let sandbox_id = sandbox_id.clone();
    tokio::spawn(async move {
        let run = async {
            if with_upgrades {
                connection.with_upgrades().await
            } else {
                connection.await
            }
        };
        // Dropping the connection closes the socket and ends any response on it.
        let result = tokio::select! {
            result = run => result,
            () = closer.cancelled() => Ok(()),
        };
        if let Err(error) = result {
            tracing::debug!(%sandbox_id, %error, "sandbox connection ended with an error");
        }
    });
    Ok(sender)
}

/// Current unix time in seconds (signature expirations are unix seconds).
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
        })
}

fn empty_body() -> ProxyBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

async fn tunnel(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
) -> Result<(), BoxError> {
    let (client, upstream) = tokio::try_join!(client, upstream)?;
    let mut client = TokioIo::new(client);
    let mut upstream = TokioIo::new(upstream);
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// Enforces the sandbox's access tokens for the addressed port.
fn authorize(headers: &HeaderMap, target: &Target, route: &Route) -> Result<(), ProxyError> {
    if target.port == ENVD_PORT {
        let Some(expected) = &route.envd_access_token else {
            return Ok(());
        };
        // envd answers these without a token: its health check, and file URLs that
        // carry their own signature (envd verifies it).
        let exempt = target.path() == "/health"
            || (target.path() == "/files"
                && target.query().is_some_and(|query| {
                    query.split('&').any(|pair| pair.starts_with("signature="))
                }));
        if exempt || header_matches(headers, ACCESS_TOKEN, expected) {
            return Ok(());
        }
        return Err(ProxyError::EnvdAccessDenied);
    }
    if route.allow_public_traffic {
        return Ok(());
    }
    match &route.traffic_access_token {
        Some(expected) if header_matches(headers, TRAFFIC_ACCESS_TOKEN_HEADER, expected) => Ok(()),
        _ => Err(ProxyError::TrafficAccessDenied),
    }
}

fn header_matches(headers: &HeaderMap, name: &str, expected: &str) -> bool {
    headers
        .get(name)
        .is_some_and(|value| constant_time_eq(value.as_bytes(), expected.as_bytes()))
}

fn is_upgrade_request<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_11
        && req.headers().contains_key(header::UPGRADE)
        && req
            .headers()
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
}

/// The request as the sandbox's port sees it: HTTP/1.1, origin-form path (prefix
/// removed), hop-by-hop and proxy-only headers dropped, `Host` kept as the client
/// sent it so apps that check it (dev servers) see their public name — or, on user
/// ports of a sandbox with `maskRequestHost`, the mask.
fn upstream_request<B>(
    req: Request<B>,
    target: &Target,
    route: &Route,
    upgrade: bool,
) -> Request<ProxyBody>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (mut parts, body) = req.into_parts();
    let upgrade_protocol = parts.headers.get(header::UPGRADE).cloned();
    if !parts.headers.contains_key(header::HOST) {
        if let Some(authority) = parts.uri.authority() {
            if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
                parts.headers.insert(header::HOST, host);
            }
        }
    }
    if let Some(mask) = route.mask_request_host.as_deref() {
        let masked = mask.replace("${PORT}", &target.port.to_string());
        if let (true, Ok(host)) = (target.port != ENVD_PORT, HeaderValue::from_str(&masked)) {
            parts.headers.insert(header::HOST, host);
        }
    }
    remove_hop_by_hop_headers(&mut parts.headers);
    for name in [SANDBOX_ID, SANDBOX_PORT, TRAFFIC_ACCESS_TOKEN_HEADER] {
        parts.headers.remove(name);
    }
    if upgrade {
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        if let Some(protocol) = upgrade_protocol {
            parts.headers.insert(header::UPGRADE, protocol);
        }
    }
    parts.version = Version::HTTP_11;
    parts.uri =
        Uri::try_from(target.path_and_query.as_str()).unwrap_or_else(|_| Uri::from_static("/"));
    let body = if upgrade {
        empty_body()
    } else {
        body.map_err(Into::into).boxed_unsync()
    };
    Request::from_parts(parts, body)
}

fn remove_hop_by_hop_headers(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    for name in listed.iter().chain(HOP_BY_HOP_HEADERS.iter()) {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolver::{BoxFuture, PortConnector};
    use crate::target::Addressing;

    struct Unreachable;

    impl PortConnector for Unreachable {
        fn connect(&self, _port: u16) -> BoxFuture<'_, io::Result<tokio::net::TcpStream>> {
            Box::pin(async { Err(io::Error::from(io::ErrorKind::ConnectionRefused)) })
        }
    }

    fn route(envd_token: Option<&str>, traffic_token: Option<&str>, public: bool) -> Route {
        Route {
            connector: Arc::new(Unreachable),
            envd_access_token: envd_token.map(str::to_owned),
            traffic_access_token: traffic_token.map(str::to_owned),
            allow_public_traffic: public,
            mask_request_host: None,
        }
    }

    fn target(port: u16, path_and_query: &str) -> Target {
        Target {
            sandbox_id: SandboxId::parse("iabc").unwrap(),
            port,
            addressing: Addressing::Headers,
            path_and_query: path_and_query.to_owned(),
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| {
                (
                    HeaderName::from_static(name),
                    HeaderValue::from_static(value),
                )
            })
            .collect()
    }

    #[test]
    fn envd_token_is_required_only_for_secure_sandboxes() {
        let open = route(None, None, true);
        assert!(authorize(&headers(&[]), &target(ENVD_PORT, "/files"), &open).is_ok());

        let secure = route(Some("secret"), None, true);
        let files = target(ENVD_PORT, "/files?path=a");
        assert!(matches!(
            authorize(&headers(&[]), &files, &secure),
            Err(ProxyError::EnvdAccessDenied)
        ));
        assert!(matches!(
            authorize(&headers(&[("x-access-token", "secreT")]), &files, &secure),
            Err(ProxyError::EnvdAccessDenied)
        ));
        assert!(authorize(&headers(&[("x-access-token", "secret")]), &files, &secure).is_ok());
        assert!(authorize(&headers(&[]), &target(ENVD_PORT, "/health"), &secure).is_ok());
        let signed = target(ENVD_PORT, "/files?path=a&signature=v1_x");
        assert!(authorize(&headers(&[]), &signed, &secure).is_ok());
    }

    #[test]
    fn traffic_token_is_required_when_public_traffic_is_off() {
        let public = route(None, Some("t0k"), true);
        assert!(authorize(&headers(&[]), &target(8080, "/"), &public).is_ok());

        let private = route(None, Some("t0k"), false);
        assert!(matches!(
            authorize(&headers(&[]), &target(8080, "/"), &private),
            Err(ProxyError::TrafficAccessDenied)
        ));
        let with_token = headers(&[("e2b-traffic-access-token", "t0k")]);
        assert!(authorize(&with_token, &target(8080, "/"), &private).is_ok());

        let private_without_token = route(None, None, false);
        assert!(matches!(
            authorize(&with_token, &target(8080, "/"), &private_without_token),
            Err(ProxyError::TrafficAccessDenied)
        ));
    }

    #[test]
    fn upstream_request_drops_proxy_headers_and_prefix() {
        let req = Request::builder()
            .uri("/proxy/iabc/8080/app?q=1")
            .header("host", "127.0.0.1:3000")
            .header("connection", "keep-alive, x-hop")
            .header("x-hop", "1")
            .header("e2b-traffic-access-token", "t")
            .header("x-app", "kept")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let forwarded = upstream_request(
            req,
            &target(8080, "/app?q=1"),
            &route(None, None, true),
            false,
        );
        assert_eq!(forwarded.uri(), "/app?q=1");
        assert_eq!(forwarded.version(), Version::HTTP_11);
        let names: Vec<&str> = forwarded.headers().keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["host", "x-app"]);
        assert_eq!(forwarded.headers()[header::HOST], "127.0.0.1:3000");
    }

    #[test]
    fn a_host_mask_replaces_host_on_user_ports_only() {
        let mut masked = route(None, None, true);
        masked.mask_request_host = Some("${PORT}-app.internal".into());
        let request = || {
            Request::builder()
                .uri("/")
                .header("host", "client.example")
                .body(Empty::<Bytes>::new())
                .unwrap()
        };
        let user = upstream_request(request(), &target(8080, "/"), &masked, false);
        assert_eq!(user.headers()[header::HOST], "8080-app.internal");
        let envd = upstream_request(request(), &target(ENVD_PORT, "/"), &masked, false);
        assert_eq!(envd.headers()[header::HOST], "client.example");
    }

    #[test]
    fn connector_errors_are_classified_for_the_sdks() {
        let envd = target(ENVD_PORT, "/");
        assert!(matches!(
            connect_error(&envd, io::Error::from(io::ErrorKind::ConnectionRefused)),
            ProxyError::PortNotOpen {
                port: ENVD_PORT,
                ..
            }
        ));
        assert!(matches!(
            connect_error(&envd, io::Error::from(io::ErrorKind::NotFound)),
            ProxyError::SandboxNotFound { .. }
        ));
        assert!(matches!(
            connect_error(&envd, io::Error::from_raw_os_error(libc::ESRCH)),
            ProxyError::SandboxNotFound { .. }
        ));
        assert!(matches!(
            connect_error(&envd, io::Error::from_raw_os_error(libc::EMFILE)),
            ProxyError::Connect { .. }
        ));
    }

    #[tokio::test]
    async fn not_found_json_has_the_shape_the_sdks_expect() {
        let response = ProxyError::SandboxNotFound {
            sandbox_id: SandboxId::parse("iabc").unwrap(),
        }
        .into_response();
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"sandboxId": "iabc", "message": "The sandbox was not found", "code": 502})
        );
    }
}
