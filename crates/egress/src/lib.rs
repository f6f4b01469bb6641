//! berth's sandbox egress, userland half.
//!
//! Owns: the transparent TCP egress proxy that enforces E2B's domain rules (HTTP Host on
//! port 80, TLS SNI on port 443), the DNS server sandboxes resolve through, and the
//! per-sandbox policy decisions both make (`allow_internet_access`, `allowOut` /
//! `denyOut`, the operator ceiling, built-in denied ranges), header injection with
//! secrets for rule domains, and the interception CA that makes it possible for HTTPS.
//!
//! Does not own: namespaces, links, addresses, routes or nftables (crate `berth-net`
//! redirects sandbox DNS and, for sandboxes with domain rules, TCP 80/443 to the ports
//! bound here, and enforces CIDR policy for all other traffic), nor where policies come
//! from (the daemon implements [`PolicySource`]).
//!
//! Design. [`Egress::start`] binds three listeners on the gateway address: HTTP and TLS
//! proxy ports and a DNS port (UDP and TCP). Every connection and query is judged by a
//! fresh [`PolicySource::lookup`] of its source address, and a live connection is
//! re-judged every `recheck_interval`, so policy updates apply at once and cut
//! connections they deny. A proxied connection's original destination comes from
//! SO_ORIGINAL_DST. When the address alone does not allow it, the proxy reads the
//! request head or ClientHello (bounded in size and time, kept and replayed upstream),
//! and on a domain match dials the *name*, resolved by the same upstream resolvers the
//! DNS server forwards to, skipping every address the ceiling denies: a forged Host or
//! a spoofed DNS answer can never steer it to the original (denied) address or into the
//! host's networks. Allowed connections are spliced both ways; refusals get an HTTP 403
//! with a one-line reason (HTTP) or a close (TLS).
//!
//! Header rules (`network.rules`, issue 14): a connection whose name matches a rule
//! domain is always dialed by name (so a secret reaches only the real server) and, when
//! [`EgressConfig::interception`] is set, its HTTP/1.1 requests are rewritten one by one
//! (framing-aware: keep-alive, pipelining, Content-Length and chunked bodies; ambiguous
//! framing is refused) with the rule's headers, `${e2b.secrets.NAME}` resolved per
//! request by the daemon's [`SecretResolver`]. For TLS the proxy terminates with a leaf
//! issued on the fly by the installation's CA (ALPN http/1.1 only) and re-encrypts to
//! the server, verified against the host's trust store (plus extra roots); a server
//! that fails verification gets the sandbox a 502, never a plaintext or unverified
//! fallback. Responses flow back untouched. Every other connection is a blind splice.
//!
//! Choices where E2B leaves room: `*.example.com` matches names under example.com but
//! not example.com itself (as E2B's suffix matcher does); a trailing dot is ignored.
//! DNS answers REFUSED to unknown sources and sandboxes without internet, and NXDOMAIN
//! for names a restricted policy could never allow. A Host header's port is ignored:
//! the upstream port is always the original destination's. Rule domains still need the
//! policy to allow them (by domain or by their original address): rules never widen it.
#![forbid(unsafe_code)]

mod ca;
mod dns;
mod error;
mod inject;
mod intercept;
mod metrics;
mod original_dst;
mod policy;
mod proxy;
mod sniff;
mod splice;
mod upstream;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UdpSocket};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use error::{CaError, PolicyError, StartError};
pub use inject::{HeaderRule, HeaderTemplate, SecretResolver, SecretValue};
pub use intercept::InterceptionConfig;
/// Types of other crates in this API, re-exported so callers need not depend on them.
pub use ipnet::IpNet;
pub use metrics::{EgressCounters, Protocol};
pub use policy::{
    normalize_hostname, Ceiling, DomainPattern, DomainRule, EgressPolicy, NetRule, PolicySource,
    Ports, RefuseReason, Route, Rule, BUILTIN_DENIED,
};
pub use rustls::pki_types::CertificateDer;
pub use upstream::nameservers_from_resolv_conf;

/// How the egress services are started.
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// The gateway address sandboxes reach the host on (every listener binds it).
    pub listen_addr: IpAddr,
    /// Port of the HTTP proxy (sandbox port-80 traffic); 0 picks one.
    pub http_port: u16,
    /// Port of the TLS proxy (sandbox port-443 traffic); 0 picks one.
    pub tls_port: u16,
    /// Port of the DNS server, UDP and TCP; 0 picks one (the same for both).
    pub dns_port: u16,
    /// Upstream resolvers; empty means the nameservers of /etc/resolv.conf.
    pub upstream_dns: Vec<SocketAddr>,
    /// Per upstream DNS exchange.
    pub dns_timeout: Duration,
    /// Time allowed for the request head / ClientHello to arrive.
    pub sniff_timeout: Duration,
    /// Largest request head / ClientHello read before refusing.
    pub sniff_max_bytes: usize,
    pub connect_timeout: Duration,
    /// A connection with no byte in either direction for this long is closed.
    pub idle_timeout: Duration,
    /// How often live connections are re-checked against the current policy.
    pub recheck_interval: Duration,
    pub max_connections_per_sandbox: usize,
    /// Header injection for `network.rules` domains (TLS terminated with the
    /// installation's CA). `None`: rule domains are dialed by name and spliced as is.
    pub interception: Option<InterceptionConfig>,
}

impl EgressConfig {
    /// Defaults for a gateway address; ports are picked.
    pub fn new(listen_addr: IpAddr) -> Self {
        EgressConfig {
            listen_addr,
            http_port: 0,
            tls_port: 0,
            dns_port: 0,
            upstream_dns: Vec::new(),
            dns_timeout: Duration::from_secs(3),
            sniff_timeout: Duration::from_secs(10),
            sniff_max_bytes: 16 * 1024,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            recheck_interval: Duration::from_secs(1),
            max_connections_per_sandbox: 256,
            interception: None,
        }
    }
}

/// Starts the egress services.
pub struct Egress;

/// The running services. Dropping it without [`EgressHandle::shutdown`] stops
/// accepting and cuts every connection at once.
pub struct EgressHandle {
    pub http_addr: SocketAddr,
    pub tls_addr: SocketAddr,
    /// Bound on both UDP and TCP.
    pub dns_addr: SocketAddr,
    /// The interception CA's certificate (PEM), for sandboxes' trust stores; `None`
    /// without interception.
    pub ca_cert_pem: Option<String>,
    metrics: Arc<metrics::Metrics>,
    stop_accepting: CancellationToken,
    stop_all: CancellationToken,
    proxy_tasks: TaskTracker,
    dns_tasks: TaskTracker,
}

impl Egress {
    /// Binds the listeners and spawns the services on the current tokio runtime.
    pub async fn start(
        config: EgressConfig,
        policies: Arc<dyn PolicySource>,
    ) -> Result<EgressHandle, StartError> {
        let upstream_servers = if config.upstream_dns.is_empty() {
            nameservers_from_resolv_conf(Path::new("/etc/resolv.conf"))?
        } else {
            config.upstream_dns.clone()
        };
        let upstreams = Arc::new(upstream::Upstreams::new(
            upstream_servers,
            config.dns_timeout,
        ));
        let metrics = Arc::new(metrics::Metrics::default());
        let intercept = config
            .interception
            .as_ref()
            .map(intercept::Interceptor::new)
            .transpose()?
            .map(Arc::new);
        let ca_cert_pem = intercept.as_ref().map(|i| i.ca_pem().to_string());

        let bind_tcp = |what: &'static str, port: u16| {
            let addr = SocketAddr::new(config.listen_addr, port);
            async move {
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| StartError::Bind { what, addr, source })
            }
        };
        let http = bind_tcp("HTTP proxy", config.http_port).await?;
        let tls = bind_tcp("TLS proxy", config.tls_port).await?;
        let dns_udp_addr = SocketAddr::new(config.listen_addr, config.dns_port);
        let dns_udp = UdpSocket::bind(dns_udp_addr)
            .await
            .map_err(|source| StartError::Bind {
                what: "DNS (UDP)",
                addr: dns_udp_addr,
                source,
            })?;
        let local = |r: std::io::Result<SocketAddr>, what, addr| {
            r.map_err(|source| StartError::Bind { what, addr, source })
        };
        let dns_addr = local(dns_udp.local_addr(), "DNS (UDP)", dns_udp_addr)?;
        let dns_tcp = bind_tcp("DNS (TCP)", dns_addr.port()).await?;
        let http_addr = local(http.local_addr(), "HTTP proxy", dns_udp_addr)?;
        let tls_addr = local(tls.local_addr(), "TLS proxy", dns_udp_addr)?;

        let proxy = Arc::new(proxy::Proxy::new(
            policies.clone(),
            upstreams.clone(),
            metrics.clone(),
            proxy::ProxyLimits {
                sniff_timeout: config.sniff_timeout,
                sniff_max_bytes: config.sniff_max_bytes,
                connect_timeout: config.connect_timeout,
                idle_timeout: config.idle_timeout,
                recheck_interval: config.recheck_interval,
                max_connections_per_sandbox: config.max_connections_per_sandbox,
            },
            vec![http_addr, tls_addr],
            intercept,
        ));
        let dns = Arc::new(dns::DnsServer {
            policies,
            upstreams,
            metrics: metrics.clone(),
            tcp_idle: config.sniff_timeout,
        });

        let stop_accepting = CancellationToken::new();
        let stop_all = CancellationToken::new();
        let proxy_tasks = TaskTracker::new();
        let dns_tasks = TaskTracker::new();
        let serve = |listener, protocol| {
            proxy.clone().serve(
                listener,
                protocol,
                stop_accepting.clone(),
                stop_all.clone(),
                proxy_tasks.clone(),
            )
        };
        proxy_tasks.spawn(serve(http, Protocol::Http));
        proxy_tasks.spawn(serve(tls, Protocol::Tls));
        dns_tasks.spawn(
            dns.clone()
                .serve_udp(dns_udp, stop_all.clone(), dns_tasks.clone()),
        );
        dns_tasks.spawn(dns.serve_tcp(dns_tcp, stop_all.clone(), dns_tasks.clone()));
        tracing::info!(%http_addr, %tls_addr, %dns_addr, "egress proxy and DNS listening");
        Ok(EgressHandle {
            http_addr,
            tls_addr,
            dns_addr,
            ca_cert_pem,
            metrics,
            stop_accepting,
            stop_all,
            proxy_tasks,
            dns_tasks,
        })
    }
}

impl EgressHandle {
    /// The counters so far.
    pub fn counters(&self) -> EgressCounters {
        self.metrics.snapshot()
    }

    /// Stops accepting proxy connections, lets open ones finish for up to `grace`,
    /// then cuts the rest and stops DNS. Returns when every task has ended.
    pub async fn shutdown(self, grace: Duration) {
        self.stop_accepting.cancel();
        self.proxy_tasks.close();
        self.dns_tasks.close();
        let _ = tokio::time::timeout(grace, self.proxy_tasks.wait()).await;
        self.stop_all.cancel();
        self.proxy_tasks.wait().await;
        self.dns_tasks.wait().await;
    }
}

impl Drop for EgressHandle {
    fn drop(&mut self) {
        self.stop_accepting.cancel();
        self.stop_all.cancel();
    }
}
