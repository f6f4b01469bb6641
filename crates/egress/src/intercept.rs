//! Header injection for rule domains: plain HTTP is rewritten in place; HTTPS is
//! terminated with a leaf from the installation's CA, rewritten, and re-encrypted to
//! the real server, whose certificate is verified (host trust store plus optional
//! extra roots). Only rule domains come here; everything else stays a blind splice.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::ca::LeafResolver;
use crate::error::StartError;
use crate::inject::{self, InjectError, SecretResolver};
use crate::metrics::Protocol;
use crate::policy::RefuseReason;
use crate::proxy::{refusal_response, Admitted, Proxy};
use crate::splice::{self, Activity, End};
use berth_ca::CertificateAuthority;

/// How TLS for rule domains is terminated and re-established.
#[derive(Clone)]
pub struct InterceptionConfig {
    /// Where the installation's CA lives (`ca.key`, 0600, and `ca.crt`); created on
    /// first start.
    pub ca_dir: PathBuf,
    /// Trust the host's certificate store for upstream servers.
    pub host_roots: bool,
    /// Further trusted roots for upstream servers (tests, private CAs).
    pub extra_upstream_roots: Vec<CertificateDer<'static>>,
    /// Resolves `${e2b.secrets.NAME}` per request.
    pub secrets: Arc<dyn SecretResolver>,
}

impl std::fmt::Debug for InterceptionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterceptionConfig")
            .field("ca_dir", &self.ca_dir)
            .field("host_roots", &self.host_roots)
            .field("extra_upstream_roots", &self.extra_upstream_roots.len())
            .finish_non_exhaustive()
    }
}

pub(crate) struct Interceptor {
    ca: Arc<CertificateAuthority>,
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
    secrets: Arc<dyn SecretResolver>,
}

impl Interceptor {
    pub(crate) fn new(config: &InterceptionConfig) -> Result<Self, StartError> {
        let ca = Arc::new(CertificateAuthority::load_or_create(
            &config.ca_dir,
            "berth egress CA",
        )?);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(LeafResolver(ca.clone())));
        server.alpn_protocols = vec![b"http/1.1".to_vec()];

        let mut roots = rustls::RootCertStore::empty();
        if config.host_roots {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
        roots.add_parsable_certificates(config.extra_upstream_roots.iter().cloned());
        if roots.is_empty() {
            return Err(StartError::NoUpstreamRoots);
        }
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Interceptor {
            ca,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
            secrets: config.secrets.clone(),
        })
    }

    pub(crate) fn ca_pem(&self) -> &str {
        self.ca.cert_pem()
    }

    /// Serves one connection to rule domain `name`.
    pub(crate) async fn handle(
        &self,
        proxy: &Proxy,
        client: TcpStream,
        mut admitted: Admitted,
        name: String,
        protocol: Protocol,
        stop: CancellationToken,
    ) {
        let sandbox = admitted.sandbox;
        let Some(rule) = admitted.policy.header_rule(&name).cloned() else {
            return;
        };
        let resolve = move |secret: &str| self.secrets.resolve(sandbox, secret);
        let first_bytes = std::mem::take(&mut admitted.first_bytes);
        let client = Prefixed::new(first_bytes, client);
        match protocol {
            Protocol::Http => {
                if let Err(reason) = inject::render_headers(&rule, &resolve)
                    .map(drop)
                    .map_err(|_| RefuseReason::SecretUnavailable)
                {
                    return refuse(proxy, client, reason).await;
                }
                let upstream = match proxy.dial(&admitted).await {
                    Ok(upstream) => upstream,
                    Err(reason) => return refuse(proxy, client, reason).await,
                };
                self.relay(
                    proxy, client, upstream, &admitted, &rule, &resolve, protocol, &stop,
                )
                .await;
            }
            Protocol::Tls => {
                let Ok(client) = self.acceptor.accept(client).await else {
                    proxy.metrics.refused(RefuseReason::BadRequest);
                    return;
                };
                proxy.metrics.terminated();
                if inject::render_headers(&rule, &resolve).is_err() {
                    return refuse(proxy, client, RefuseReason::SecretUnavailable).await;
                }
                let tcp = match proxy.dial(&admitted).await {
                    Ok(upstream) => upstream,
                    Err(reason) => return refuse(proxy, client, reason).await,
                };
                let server_name = ServerName::try_from(name.clone())
                    .expect("a normalized host name is a valid server name");
                let upstream = match self.connector.connect(server_name, tcp).await {
                    Ok(upstream) => upstream,
                    Err(error) => {
                        tracing::warn!(%sandbox, %name, %error, "egress refused: upstream TLS failed");
                        return refuse(proxy, client, RefuseReason::UpstreamTlsFailed).await;
                    }
                };
                self.relay(
                    proxy, client, upstream, &admitted, &rule, &resolve, protocol, &stop,
                )
                .await;
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn relay<C, U>(
        &self,
        proxy: &Proxy,
        client: C,
        upstream: U,
        admitted: &Admitted,
        rule: &inject::HeaderRule,
        resolve: &(dyn Fn(&str) -> Option<inject::SecretValue> + Sync),
        protocol: Protocol,
        stop: &CancellationToken,
    ) where
        C: AsyncRead + AsyncWrite + Unpin,
        U: AsyncRead + AsyncWrite + Unpin,
    {
        proxy.metrics.allowed(protocol);
        let activity = Activity::new();
        let (cr, cw) = tokio::io::split(client);
        let (ur, mut uw) = tokio::io::split(upstream);
        let metrics = &proxy.metrics;
        let mut requests = BufReader::new(cr);
        let failure = std::sync::Mutex::new(None);
        let transfer = async {
            let up = async {
                let result = inject::forward_requests(
                    &mut requests,
                    &mut uw,
                    rule,
                    resolve,
                    proxy.limits.sniff_max_bytes,
                    &|| {
                        metrics.injected();
                        activity.touch();
                    },
                    &|n| metrics.to_upstream(n),
                )
                .await;
                result.map_err(|e| {
                    let io = std::io::Error::other("request forwarding stopped");
                    *failure
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
                    io
                })
            };
            let down = splice::pump(ur, cw, &activity, |n| metrics.to_sandbox(n));
            tokio::try_join!(up, down).map(|_| ())
        };
        let end = splice::supervise(
            transfer,
            &activity,
            proxy.limits.idle_timeout,
            proxy.limits.recheck_interval,
            stop,
            || proxy.still_allowed(admitted),
        )
        .await;
        if end == End::Revoked {
            metrics.refused(RefuseReason::PolicyChanged);
        }
        match failure
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            Some(InjectError::SecretUnavailable(secret)) => {
                metrics.refused(RefuseReason::SecretUnavailable);
                tracing::warn!(sandbox = %admitted.sandbox, %secret, "egress connection cut: secret unavailable");
            }
            Some(InjectError::BadRequest) => metrics.refused(RefuseReason::BadRequest),
            Some(InjectError::Io(error)) => {
                tracing::debug!(sandbox = %admitted.sandbox, %error, "egress connection ended")
            }
            None => {}
        }
    }
}

/// Refuses on a stream of either kind (plain or terminated TLS): an HTTP response with
/// the reason, then close.
async fn refuse<S: AsyncWrite + Unpin>(proxy: &Proxy, mut client: S, reason: RefuseReason) {
    proxy.metrics.refused(reason);
    tracing::info!(reason = reason.as_str(), "egress refused");
    let _ = client.write_all(refusal_response(reason).as_bytes()).await;
    let _ = client.shutdown().await;
}

/// A stream whose first reads return bytes already read from it (the sniffed request
/// head or ClientHello).
pub(crate) struct Prefixed<S> {
    prefix: Vec<u8>,
    offset: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub(crate) fn new(prefix: Vec<u8>, inner: S) -> Self {
        Prefixed {
            prefix,
            offset: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.offset < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.offset);
            let start = self.offset;
            buf.put_slice(&self.prefix[start..start + n]);
            self.offset += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
