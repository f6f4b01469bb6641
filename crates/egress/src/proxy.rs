//! The transparent TCP egress proxy: sandbox port-80 and port-443 traffic, redirected
//! here by nftables, is routed by the sandbox's policy and spliced to its upstream.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::{Metrics, Protocol};
use crate::original_dst::original_dst;
use crate::policy::{EgressPolicy, PolicySource, RefuseReason, Route};
use crate::sniff::{self, Sniff};
use crate::splice::{self, Activity, End};
use crate::upstream::Upstreams;

/// Timeouts and limits of the proxy (see [`crate::EgressConfig`]).
#[derive(Debug, Clone)]
pub(crate) struct ProxyLimits {
    pub(crate) sniff_timeout: Duration,
    pub(crate) sniff_max_bytes: usize,
    pub(crate) connect_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) recheck_interval: Duration,
    pub(crate) max_connections_per_sandbox: usize,
}

pub(crate) struct Proxy {
    pub(crate) policies: Arc<dyn PolicySource>,
    pub(crate) upstreams: Arc<Upstreams>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) limits: ProxyLimits,
    /// The proxy's own listening addresses: a connection whose original destination
    /// is one of them was not redirected, and dialing it would loop.
    pub(crate) own_addrs: Vec<SocketAddr>,
    /// Header injection for rule domains; without it rule domains are spliced blindly.
    pub(crate) intercept: Option<Arc<crate::intercept::Interceptor>>,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// Holds one of a sandbox's connection slots; frees it when dropped.
struct Slot<'a> {
    proxy: &'a Proxy,
    sandbox: IpAddr,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut open = self
            .proxy
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.sandbox) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.sandbox);
            }
        }
    }
}

/// Where an allowed connection goes, with what the client already sent.
pub(crate) struct Admitted {
    pub(crate) sandbox: IpAddr,
    pub(crate) original: SocketAddr,
    pub(crate) host: Option<String>,
    pub(crate) route: Route,
    pub(crate) policy: Arc<EgressPolicy>,
    pub(crate) first_bytes: Vec<u8>,
}

impl Proxy {
    pub(crate) fn new(
        policies: Arc<dyn PolicySource>,
        upstreams: Arc<Upstreams>,
        metrics: Arc<Metrics>,
        limits: ProxyLimits,
        own_addrs: Vec<SocketAddr>,
        intercept: Option<Arc<crate::intercept::Interceptor>>,
    ) -> Self {
        Proxy {
            policies,
            upstreams,
            metrics,
            limits,
            own_addrs,
            intercept,
            open: Mutex::new(HashMap::new()),
        }
    }

    fn take_slot(&self, sandbox: IpAddr) -> Option<Slot<'_>> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(sandbox).or_insert(0);
        if *n >= self.limits.max_connections_per_sandbox {
            return None;
        }
        *n += 1;
        Some(Slot {
            proxy: self,
            sandbox,
        })
    }

    pub(crate) async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        protocol: Protocol,
        stop_accepting: CancellationToken,
        stop_all: CancellationToken,
        tasks: TaskTracker,
    ) {
        loop {
            let accepted = tokio::select! {
                _ = stop_accepting.cancelled() => return,
                r = listener.accept() => r,
            };
            let Ok((stream, peer)) = accepted else {
                continue;
            };
            let (proxy, stop) = (self.clone(), stop_all.clone());
            tasks.spawn(async move { proxy.handle(stream, peer, protocol, stop).await });
        }
    }

    async fn handle(
        &self,
        mut client: TcpStream,
        peer: SocketAddr,
        protocol: Protocol,
        stop: CancellationToken,
    ) {
        let _ = client.set_nodelay(true);
        let sandbox = peer.ip().to_canonical();
        let Some(slot) = self.take_slot(sandbox) else {
            return self
                .refuse(client, protocol, RefuseReason::TooManyConnections)
                .await;
        };
        let admitted = match self.admit(&mut client, sandbox, protocol).await {
            Ok(admitted) => admitted,
            Err(reason) => {
                // Freed before the refusal closes the connection: a sandbox that sees
                // it end may open the next one at once.
                drop(slot);
                return self.refuse(client, protocol, reason).await;
            }
        };
        if let (Route::Name(name), Some(intercept)) = (&admitted.route, &self.intercept) {
            if admitted.policy.header_rule(name).is_some() {
                let name = name.clone();
                return intercept
                    .handle(self, client, admitted, name, protocol, stop)
                    .await;
            }
        }
        let mut upstream = match self.dial(&admitted).await {
            Ok(upstream) => upstream,
            Err(reason) => {
                drop(slot);
                return self.refuse(client, protocol, reason).await;
            }
        };
        if upstream.write_all(&admitted.first_bytes).await.is_err() {
            drop(slot);
            return self
                .refuse(client, protocol, RefuseReason::UpstreamUnreachable)
                .await;
        }
        self.metrics.to_upstream(admitted.first_bytes.len());
        self.metrics.allowed(protocol);
        tracing::debug!(%sandbox, original = %admitted.original, host = ?admitted.host, "egress allowed");
        let activity = Activity::new();
        let (cr, cw) = client.into_split();
        let (ur, uw) = upstream.into_split();
        let metrics = &self.metrics;
        let transfer = async {
            let up = splice::pump(cr, uw, &activity, |n| metrics.to_upstream(n));
            let down = splice::pump(ur, cw, &activity, |n| metrics.to_sandbox(n));
            tokio::try_join!(up, down).map(|_| ())
        };
        let end = splice::supervise(
            transfer,
            &activity,
            self.limits.idle_timeout,
            self.limits.recheck_interval,
            &stop,
            || self.still_allowed(&admitted),
        )
        .await;
        drop(slot);
        if end == End::Revoked {
            self.metrics.refused(RefuseReason::PolicyChanged);
            tracing::info!(%sandbox, original = %admitted.original, "egress connection cut: policy changed");
        }
    }

    /// Looks up the policy, reads the original destination and (when the policy needs
    /// it) the Host / SNI, and routes.
    async fn admit(
        &self,
        client: &mut TcpStream,
        sandbox: IpAddr,
        protocol: Protocol,
    ) -> Result<Admitted, RefuseReason> {
        let policy = self
            .policies
            .lookup(sandbox)
            .ok_or(RefuseReason::UnknownSource)?;
        let original = original_dst(client).map_err(|_| RefuseReason::Loop)?;
        if self.own_addrs.contains(&original) {
            return Err(RefuseReason::Loop);
        }
        if !policy.internet {
            return Err(RefuseReason::NoInternet);
        }
        let (host, first_bytes) = if policy.needs_hostname(original.ip(), original.port()) {
            self.sniff(client, protocol).await?
        } else {
            (None, Vec::new())
        };
        match policy.route(original.ip(), original.port(), host.as_deref()) {
            Route::Refuse(reason) => Err(reason),
            route => Ok(Admitted {
                sandbox,
                original,
                host,
                route,
                policy,
                first_bytes,
            }),
        }
    }

    /// Reads until the request head / ClientHello is complete, within the size and
    /// time bounds. Returns the name and every byte read.
    async fn sniff(
        &self,
        client: &mut TcpStream,
        protocol: Protocol,
    ) -> Result<(Option<String>, Vec<u8>), RefuseReason> {
        let deadline = tokio::time::Instant::now() + self.limits.sniff_timeout;
        let mut buf = Vec::with_capacity(2048);
        loop {
            let parsed = match protocol {
                Protocol::Http => sniff::http_host(&buf),
                Protocol::Tls => sniff::tls_sni(&buf),
            };
            match parsed {
                Sniff::Host(host) => return Ok((host, buf)),
                Sniff::Malformed => return Err(RefuseReason::BadRequest),
                Sniff::Incomplete if buf.len() >= self.limits.sniff_max_bytes => {
                    return Err(RefuseReason::BadRequest)
                }
                Sniff::Incomplete => {}
            }
            let mut chunk = [0u8; 4096];
            let want = chunk.len().min(self.limits.sniff_max_bytes - buf.len());
            let n = tokio::time::timeout_at(deadline, client.read(&mut chunk[..want]))
                .await
                .map_err(|_| RefuseReason::SniffFailed)?
                .map_err(|_| RefuseReason::SniffFailed)?;
            if n == 0 {
                return Err(RefuseReason::SniffFailed);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Connects to the admitted connection's upstream: the original address, or the
    /// name resolved upstream with every denied address dropped.
    pub(crate) async fn dial(&self, admitted: &Admitted) -> Result<TcpStream, RefuseReason> {
        let port = admitted.original.port();
        let candidates = match &admitted.route {
            Route::Original => vec![admitted.original],
            Route::Name(name) => self.resolve_allowed(&admitted.policy, name, port).await?,
            Route::Refuse(reason) => return Err(*reason),
        };
        let deadline = Instant::now() + self.limits.connect_timeout;
        for addr in candidates {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Ok(Ok(stream)) = tokio::time::timeout(left, TcpStream::connect(addr)).await {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
        }
        Err(RefuseReason::UpstreamUnreachable)
    }

    async fn resolve_allowed(
        &self,
        policy: &EgressPolicy,
        name: &str,
        port: u16,
    ) -> Result<Vec<SocketAddr>, RefuseReason> {
        let resolved = self.upstreams.resolve(name).await;
        if resolved.is_empty() {
            return Err(RefuseReason::ResolveFailed);
        }
        let allowed: Vec<SocketAddr> = resolved
            .iter()
            .filter(|ip| policy.ceiling.admits_named(name, **ip))
            .map(|ip| SocketAddr::new(*ip, port))
            .collect();
        if allowed.is_empty() {
            tracing::info!(name, addresses = ?resolved, "egress refused: name resolves only to denied addresses");
            return Err(RefuseReason::ResolvedAddressDenied);
        }
        Ok(allowed)
    }

    /// Re-checks a live connection against the sandbox's current policy.
    pub(crate) fn still_allowed(&self, admitted: &Admitted) -> bool {
        self.policies
            .lookup(admitted.sandbox)
            .is_some_and(|policy| {
                policy.route(
                    admitted.original.ip(),
                    admitted.original.port(),
                    admitted.host.as_deref(),
                ) == admitted.route
            })
    }

    pub(crate) async fn refuse(
        &self,
        mut client: TcpStream,
        protocol: Protocol,
        reason: RefuseReason,
    ) {
        self.metrics.refused(reason);
        tracing::info!(peer = ?client.peer_addr().ok(), reason = reason.as_str(), "egress refused");
        if protocol == Protocol::Http {
            let _ = client.write_all(refusal_response(reason).as_bytes()).await;
            let _ = client.shutdown().await;
            drain(&mut client).await;
        }
    }
}

fn status(reason: RefuseReason) -> &'static str {
    match reason {
        RefuseReason::BadRequest => "400 Bad Request",
        RefuseReason::TooManyConnections => "429 Too Many Requests",
        RefuseReason::UpstreamUnreachable
        | RefuseReason::ResolveFailed
        | RefuseReason::UpstreamTlsFailed
        | RefuseReason::SecretUnavailable => "502 Bad Gateway",
        _ => "403 Forbidden",
    }
}

/// An HTTP/1.1 response with a one-line reason, closing the connection.
pub(crate) fn refusal_response(reason: RefuseReason) -> String {
    let status = status(reason);
    let body = format!("berth egress: {}\n", reason.message());
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\nX-Berth-Egress-Refused: {}\r\n\r\n{body}",
        body.len(),
        reason.as_str()
    )
}

/// Reads what the client still sends for a moment, so closing does not reset the
/// connection before it has read the refusal.
async fn drain(client: &mut TcpStream) {
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}
