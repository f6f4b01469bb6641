//! berth-server: the control plane.
//!
//! Owns the E2B REST API (handlers, API-key auth, team scoping), the sandbox lifecycle
//! (template → runtime → envd `/init` → record → events), the background tasks (reaper,
//! webhook delivery, metric sampling), recovery at start, and mounting the sandbox proxy
//! on the same listener as the API. It drives isolation only through the
//! [`berth_runtime::Runtime`] trait and keeps state only through [`berth_store::Store`];
//! it never touches namespaces, mounts or the database file directly.
//!
//! Entry points: [`Server::start`] (recover, spawn background tasks) and
//! [`Server::serve`] (one listener for the API and the proxy, plain HTTP and, with
//! [`ServerConfig::tls`], TLS on the same port).

#![forbid(unsafe_code)]

mod auth;
pub mod cluster;
mod envd;
mod error;
mod events;
mod extract;
mod handlers;
mod keyed_lock;
mod limits;
mod metrics;
mod openapi;
mod prometheus;
mod reaper;
mod resolver;
mod retention;
mod sandboxes;
mod secrets;
mod templates;
#[cfg(feature = "test-support")]
pub mod testing;
mod tls;
mod volumes;
mod webhook_target;
mod webhooks;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use berth_runtime::Runtime;
use berth_store::Store;
use berth_template::TemplateStore;
use keyed_lock::KeyedLocks;
use parking_lot::Mutex;
use tokio::sync::Notify;

pub use error::ServiceError;
pub use limits::{Limits, LimitsHandle, MaxLifetime, QuotaResource, Retention, TeamQuotas};
pub use openapi::openapi_document;
pub use secrets::{RotationReport, SecretVault, SecretsResolver};
pub use templates::host::{HostTemplate, HOST_FILES_SCOPE};
pub use templates::{NameError, TemplateLimits};
pub use tls::ServingTls;
pub use webhook_target::{
    Resolution, SystemResolver, WebhookConfig, WebhookResolver, WebhookTargetError,
};

/// envd version berth's sandboxes report to SDKs (they gate features on it): the version
/// of the envd berth ships.
pub use berth_envd_proto::ENVD_VERSION;

/// Request bodies of the API (not the proxy) larger than this are refused with 413.
pub const MAX_API_BODY_BYTES: usize = 1024 * 1024;

/// Resources given to every sandbox until templates carry their own.
#[derive(Debug, Clone, Copy)]
pub struct SandboxResources {
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_size_mb: u64,
}

impl Default for SandboxResources {
    fn default() -> Self {
        SandboxResources {
            cpu_count: 2,
            memory_mb: 512,
            disk_size_mb: 1024,
        }
    }
}

/// How the server is set up.
#[derive(Debug, Clone, Default)]
pub struct ServerConfig {
    /// Domain of `<port>-<id>.<domain>` sandbox hosts, reported to SDKs as `domain`.
    pub domain: Option<String>,
    /// Resources of sandboxes of installed templates, and of template builds that ask
    /// for none.
    pub resources: SandboxResources,
    /// Where webhooks may deliver (see `webhook_target`).
    pub webhooks: WebhookConfig,
    /// The most a template build may ask for.
    pub template_limits: TemplateLimits,
    /// Base of URLs berth hands out for clients to call back (COPY upload links), e.g.
    /// `https://api.example.com`; None: `http://` + the request's Host.
    pub public_url: Option<String>,
    /// Key file of the vault secrets are sealed with (`BERTH_KEK` wins when set);
    /// `berth up` passes `<state>/secrets/kek`. None keeps a random key in memory only
    /// (tests): secrets then do not outlive the process.
    pub secrets_key_file: Option<std::path::PathBuf>,
    /// Sandboxes kept started per template so a create is a claim (0: no pools).
    pub pool_size: usize,
    /// Templates this host builds itself on first use (`code-interpreter-v1`).
    pub host_templates: Vec<HostTemplate>,
    /// The operator's limits at start (lifetime, team quotas, retention); replaceable
    /// later through [`Server::limits`].
    pub limits: Limits,
    /// Standalone (`berth up`), or a node or API instance of a split deployment.
    pub role: cluster::Role,
    /// TLS beside plain HTTP on the listener (`berth up`'s serving CA); None: plain only.
    pub tls: Option<ServingTls>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("store: {0}")]
    Store(#[from] berth_store::StoreError),
    #[error("recovering sandboxes: {0}")]
    Recovery(#[from] ServiceError),
    #[error("loading the secrets vault: {0}")]
    Vault(#[from] berth_vault::VaultError),
    #[error("serving: {0}")]
    Io(#[from] std::io::Error),
}

/// Everything the handlers and background tasks share.
pub(crate) struct AppState {
    pub store: Arc<Store>,
    pub runtime: Arc<dyn Runtime>,
    pub templates: TemplateStore,
    pub config: ServerConfig,
    /// Woken when an end time changes, so the reaper re-plans its sleep.
    pub reaper_wakeup: Notify,
    /// Woken when an event may have queued webhook deliveries.
    pub delivery_wakeup: Notify,
    /// Checks webhook URLs at create/update and before every delivery.
    pub webhook_guard: webhook_target::WebhookGuard,
    /// Previous CPU reading per sandbox, to turn cumulative CPU time into a percentage.
    pub cpu_readings: Mutex<HashMap<String, metrics::CpuReading>>,
    /// Serializes creates that share an idempotency key.
    pub idempotency_locks: KeyedLocks<IdempotencyScope>,
    /// One lock per sandbox: pause, resume, kill, snapshot and fork of the same sandbox
    /// run one at a time, each seeing the state the previous one left.
    pub sandbox_locks: KeyedLocks<String>,
    /// Sandboxes being killed, gone to the proxy already (see `EndingSandboxes`).
    pub ending: sandboxes::EndingSandboxes,
    /// The proxy's connections into sandboxes, closed when a sandbox pauses or dies.
    pub connections: berth_proxy::SandboxConnections,
    /// Template builds; None when the runtime cannot run them (build routes answer 501).
    pub builds: Option<templates::Builds>,
    /// Held for reading by bring-ups that mount volumes, for writing by volume deletes
    /// (see `volumes`).
    pub volume_mounting: tokio::sync::RwLock<()>,
    /// What secrets are sealed with.
    pub secrets: Arc<SecretVault>,
    /// Sandboxes started ahead of demand, per template.
    pub pools: sandboxes::pool::WarmPools,
    /// The operator's Prometheus metrics.
    pub prometheus: prometheus::Metrics,
    /// The operator's limits in force.
    pub limits: LimitsHandle,
    /// Snapshots sandboxes are being started from, by snapshot id, with how many starts
    /// are in flight: retention leaves them alone (see `retention`).
    pub snapshot_starts: Mutex<HashMap<String, usize>>,
    /// Relays requests to nodes (API instances only).
    pub forwarder: Option<berth_cluster::Forwarder>,
}

pub(crate) type SharedState = Arc<AppState>;

/// (team id, idempotency key).
pub(crate) type IdempotencyScope = (String, String);

/// Adds a key-encryption key version to the secrets vault at `key_file` (with
/// `BERTH_KEK`, the operator adds it there first) and reseals every secret version under
/// it; safe while `berth up` runs (it reloads the keys when it meets the new version).
pub fn rotate_secrets_kek(
    store: &Store,
    key_file: &std::path::Path,
) -> Result<RotationReport, ServerError> {
    let mut vault = berth_vault::Vault::load(key_file)?;
    Ok(secrets::rotate(store, &mut vault)?)
}

/// The id of one request: the trace id of a W3C `traceparent` header (OpenTelemetry's),
/// else a client's well-formed `X-Request-Id`, else a new one.
fn request_id(headers: &axum::http::HeaderMap) -> String {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    if let Some(trace_id) = header("traceparent").and_then(|value| {
        let parts: Vec<&str> = value.split('-').collect();
        (parts.len() == 4
            && parts[1].len() == 32
            && parts[1].bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| parts[1].to_ascii_lowercase())
    }) {
        return trace_id;
    }
    if let Some(id) = header("x-request-id").filter(|id| {
        !id.is_empty()
            && id.len() <= 64
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }) {
        return id.to_owned();
    }
    uuid::Uuid::new_v4().simple().to_string()
}

/// Runs every request (API and proxied) in a `request` span carrying its id, method,
/// path (never the query: signed URLs carry their signatures there) and, for proxied
/// ones, the sandbox id; logs one `request served` line with status and duration at
/// info level, and answers the id in `X-Request-Id`.
async fn request_span(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use tracing::Instrument;
    let id = request_id(request.headers());
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        path = %request.uri().path(),
        sandbox_id = tracing::field::Empty,
    );
    let started = std::time::Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;
    span.in_scope(|| {
        tracing::info!(
            status = response.status().as_u16(),
            duration_ms = started.elapsed().as_millis() as u64,
            "request served"
        )
    });
    if let Ok(value) = axum::http::HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", value);
    }
    response
}

/// A running control plane: state plus its background tasks.
pub struct Server {
    state: SharedState,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The warm pools' refill, stopped cooperatively (see `WarmPools::stop`).
    refill: Option<tokio::task::JoinHandle<()>>,
}

impl Server {
    /// Reconcile the store with what the runtime recovered, then start the reaper,
    /// webhook delivery and metric sampling. Must run inside a tokio runtime.
    pub async fn start(
        store: Arc<Store>,
        runtime: Arc<dyn Runtime>,
        templates: TemplateStore,
        config: ServerConfig,
    ) -> Result<Server, ServerError> {
        Self::start_with_builds(store, runtime, templates, config, None).await
    }

    /// Like [`Server::start`], with template builds run by `builds` (an engine on the
    /// same runtime and template store).
    pub async fn start_with_builds(
        store: Arc<Store>,
        runtime: Arc<dyn Runtime>,
        templates: TemplateStore,
        config: ServerConfig,
        builds: Option<berth_build::BuildEngine>,
    ) -> Result<Server, ServerError> {
        let vault = match &config.secrets_key_file {
            Some(path) => berth_vault::Vault::load(path)?,
            None => berth_vault::Vault::from_keys([(1, rand::random::<[u8; 32]>())].into())?,
        };
        let pool_size = config.pool_size;
        let limits = LimitsHandle::new(config.limits.clone());
        let config_role = config.role.clone();
        let state = Arc::new(AppState {
            webhook_guard: webhook_target::WebhookGuard::new(&config.webhooks),
            store,
            runtime,
            templates,
            config,
            reaper_wakeup: Notify::new(),
            delivery_wakeup: Notify::new(),
            cpu_readings: Mutex::new(HashMap::new()),
            idempotency_locks: KeyedLocks::default(),
            sandbox_locks: KeyedLocks::default(),
            ending: sandboxes::EndingSandboxes::default(),
            connections: berth_proxy::SandboxConnections::default(),
            builds: builds.map(templates::Builds::new),
            volume_mounting: tokio::sync::RwLock::new(()),
            secrets: Arc::new(SecretVault::new(vault)),
            pools: sandboxes::pool::WarmPools::new(pool_size),
            prometheus: prometheus::Metrics::new(),
            limits,
            snapshot_starts: Mutex::new(HashMap::new()),
            forwarder: match &config_role {
                cluster::Role::Api(api) => Some(berth_cluster::Forwarder::new(api.token.clone())),
                _ => None,
            },
        });
        state
            .store
            .observe_queries(state.prometheus.store_observer());
        let mut tasks = Vec::new();
        if state.config.role.runs_sandboxes() {
            sandboxes::recover(&state).await?;
            templates::recover(&state).await?;
            tasks.push(tokio::spawn(reaper::run(state.clone())));
            tasks.push(tokio::spawn(metrics::run(state.clone())));
        }
        if state.config.role.delivers_webhooks() {
            tasks.push(tokio::spawn(webhooks::run(state.clone())));
        }
        match &state.config.role {
            cluster::Role::Node(node) => {
                // Registered once recovered: from now on API instances may place here.
                state.store.register_node(&node.registration, node.lease)?;
                tasks.push(tokio::spawn(cluster::node::keep_lease(
                    state.clone(),
                    node.clone(),
                )));
            }
            cluster::Role::Api(api) => {
                tasks.push(tokio::spawn(cluster::api::watch_leases(
                    state.clone(),
                    api.lease_check,
                )));
            }
            // Retention decides over every sandbox and snapshot in the store, which is
            // one machine's only when standalone.
            cluster::Role::Standalone => tasks.push(tokio::spawn(retention::run(state.clone()))),
        }
        let refill = match state.config.role.runs_sandboxes() {
            true => sandboxes::pool::spawn_refill(&state),
            false => None,
        };
        Ok(Server {
            state,
            tasks,
            refill,
        })
    }

    /// Builds host template `name` unless it is built already (see
    /// [`HostTemplate`]), calling `progress` with each build log entry. Returns once it
    /// is an installed template.
    pub async fn build_host_template(
        &self,
        name: &str,
        progress: impl FnMut(&berth_build::LogEntry) + Send,
    ) -> Result<(), ServiceError> {
        templates::host::ensure_built(&self.state, name, progress).await
    }

    /// Rebuilds, in the background and one after the other, the host templates built
    /// from another definition than this berth's (a new release, a rebuilt `base`). The
    /// builds they replace keep serving until each new one is ready.
    pub fn spawn_host_template_refresh(&self) -> tokio::task::JoinHandle<()> {
        let state = self.state.clone();
        tokio::spawn(async move {
            // Each is current (and returns at once) or rebuilt.
            for name in templates::host::built(&state) {
                let rebuilt = templates::host::ensure_built(&state, &name, |entry| {
                    tracing::info!(template = %name, step = ?entry.step, "{}", entry.message.trim_end())
                })
                .await;
                if let Err(err) = rebuilt {
                    tracing::warn!(template = %name, %err, "rebuilding a host template; its previous build stays in use");
                }
            }
        })
    }

    /// What tells the operator's metrics of every CRIU run; the program passes it to
    /// `berth_checkpoint::observe_criu` (CRIU runs are process-wide).
    pub fn criu_observer(&self) -> Arc<dyn berth_checkpoint::CriuObserver> {
        self.state.prometheus.criu_observer()
    }

    /// What counts the failed releases of each MCP lease sweep in the operator's
    /// metrics (`berth_sweeper_failures_total{sweeper="mcp_leases"}`).
    pub fn lease_sweep_reporter(&self) -> impl Fn(usize) + Send + Sync + 'static {
        let state = self.state.clone();
        move |failures| {
            state
                .prometheus
                .sweeper_failed("mcp_leases", u64::try_from(failures).unwrap_or(u64::MAX))
        }
    }

    /// The operator's limits in force, to read or replace while the server runs.
    pub fn limits(&self) -> LimitsHandle {
        self.state.limits.clone()
    }

    /// The resolver the egress proxy injects `${e2b.secrets.NAME}` with: `sandbox_at`
    /// maps a sandbox's address to its id (berth-net's lookup); the secret is its team's.
    pub fn secrets_resolver(
        &self,
        sandbox_at: impl Fn(std::net::IpAddr) -> Option<String> + Send + Sync + 'static,
    ) -> SecretsResolver {
        SecretsResolver::new(
            self.state.store.clone(),
            self.state.secrets.clone(),
            sandbox_at,
        )
    }

    /// `GET /metrics`: the operator's Prometheus metrics, for a listener of its own
    /// (`berth up --metrics-listen`): it has no authentication.
    pub fn metrics_router(&self) -> axum::Router {
        let state = self.state.clone();
        axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let state = state.clone();
                async move {
                    let text = tokio::task::spawn_blocking(move || state.prometheus.render(&state))
                        .await
                        .unwrap_or_default();
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        text,
                    )
                }
            }),
        )
    }

    /// The API router with the sandbox proxy in front of it: requests addressed to a
    /// sandbox (headers, `<port>-<id>.` host, `/proxy/<id>/<port>/` path, or a signed
    /// `/files` URL's signature) are forwarded,
    /// everything else is the API.
    pub fn router(&self) -> axum::Router {
        self.router_with(axum::Router::new())
    }

    /// Like [`Server::router`], with `extra` routes (e.g. `/mcp`) served beside the API.
    pub fn router_with(&self, extra: axum::Router) -> axum::Router {
        let proxy = berth_proxy::Proxy::with_connections(
            Arc::new(resolver::StoreResolver::new(self.state.clone())),
            berth_proxy::RoutingConfig {
                domain: self.state.config.domain.clone(),
            },
            self.state.connections.clone(),
        );
        let state = self.state.clone();
        let api = match &self.state.config.role {
            // What needs a node is relayed to it before any handler runs.
            cluster::Role::Api(_) => handlers::router(self.state.clone()).layer(
                axum::middleware::from_fn_with_state(self.state.clone(), cluster::api::relay),
            ),
            _ => handlers::router(self.state.clone()),
        };
        let api = match &self.state.config.role {
            cluster::Role::Node(_) => api.merge(cluster::node::routes(self.state.clone())),
            _ => api,
        };
        let router = api
            .merge(extra)
            .layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    let proxy = proxy.clone();
                    let state = state.clone();
                    async move {
                        match proxy.classify(&request) {
                            Some(Ok(target)) => {
                                tracing::Span::current().record(
                                    "sandbox_id",
                                    tracing::field::display(&target.sandbox_id),
                                );
                                let response = proxy.forward(request, target).await;
                                state.prometheus.proxied(response.status().as_u16());
                                response.map(axum::body::Body::new)
                            }
                            Some(Err(error)) => berth_proxy::ProxyError::from(error)
                                .into_response()
                                .map(axum::body::Body::new),
                            None => match berth_proxy::SignedFileUrl::from_request(&request) {
                                Some(signed) => proxy
                                    .forward_signed(request, signed)
                                    .await
                                    .map(axum::body::Body::new),
                                None => next.run(request).await,
                            },
                        }
                    }
                },
            ))
            // Outermost, so proxied requests are in a request span too.
            .layer(axum::middleware::from_fn(request_span));
        let router = match &self.state.config.role {
            // Nothing reaches a node without the node token (but its health check).
            cluster::Role::Node(node) => router.layer(axum::middleware::from_fn_with_state(
                node.token.clone(),
                cluster::node::guard,
            )),
            _ => router,
        };
        // Around everything: a refusal anywhere (a missing key, a node token, an unknown
        // sandbox) leaves the client's connection usable.
        router.layer(axum::middleware::from_fn(
            berth_leftover_body::read_what_the_answer_left,
        ))
    }

    /// Serve the API, `extra` routes and the proxy on `listener` until `shutdown` resolves, then stop
    /// the background tasks. Sandboxes keep running (a restart reattaches to them).
    pub async fn serve(
        mut self,
        listener: tokio::net::TcpListener,
        extra: axum::Router,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let app = self
            .router_with(extra)
            .into_make_service_with_connect_info::<SocketAddr>();
        use axum::serve::ListenerExt;
        match self.state.config.tls.clone() {
            // The accept loop sets TCP_NODELAY; `tap_io` only lends the connection info.
            Some(tls) => {
                axum::serve(
                    tls::SniffingListener::new(listener, tls)?.tap_io(|_| {}),
                    app,
                )
                .with_graceful_shutdown(shutdown)
                .await?
            }
            None => {
                // Without TCP_NODELAY a small write after another (a stream's frames, a
                // response head then its body) waits for the client's delayed ACK: ~40 ms
                // per call.
                let listener = listener.tap_io(|stream| {
                    if let Err(err) = stream.set_nodelay(true) {
                        tracing::warn!(%err, "setting TCP_NODELAY on an accepted connection");
                    }
                });
                axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown)
                    .await?
            }
        }
        for task in &self.tasks {
            task.abort();
        }
        // A sandbox being prepared is finished and pooled (aborting would leave its
        // runtime create running with nobody to drain what it makes).
        self.state.pools.stop();
        if let Some(refill) = self.refill.take() {
            if tokio::time::timeout(REFILL_STOP_LIMIT, refill)
                .await
                .is_err()
            {
                tracing::warn!("the warm-pool refill did not stop in time");
            }
        }
        // Pooled sandboxes are nobody's yet: they do not outlive the server.
        sandboxes::pool::drain(&self.state, None).await;
        Ok(())
    }
}

/// How long the server's stop waits for the sandbox the refill task is preparing.
const REFILL_STOP_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

impl Drop for Server {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        if let Some(refill) = &self.refill {
            refill.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::request_id;

    #[test]
    fn trace_ids_then_client_ids_then_new_ones() {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("x-request-id", "abc-1".parse().unwrap());
        assert_eq!(request_id(&headers), "abc-1");
        headers.insert(
            "traceparent",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        assert_eq!(request_id(&headers), "4bf92f3577b34da6a3ce929d0e0e4736");
        let mut odd = axum::http::HeaderMap::new();
        odd.insert("x-request-id", "has spaces".parse().unwrap());
        assert_eq!(request_id(&odd).len(), 32);
    }
}
