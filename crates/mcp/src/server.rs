//! [`Mcp`]: the components wired together, the rmcp handler of one MCP session, and the
//! entry points the `berth` binary calls (stdio, `/mcp` over HTTP, `berth connect`).

use std::path::PathBuf;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};

use crate::config::McpConfig;
use crate::connections::Connections;
use crate::error::McpError;
use crate::identity::{require_identity, Identity, IdentityResolver};
use crate::secrets::{RotationReport, Secrets};
use crate::sessions::Sessions;
use crate::store::Store;
use crate::sweeper::{SweepReport, Sweeper};
use crate::tools::{self, call_result, CallContext, Registry, ToolFailure};
use berth_vault::Vault;

/// The components of one MCP server, shared by every session and route.
pub(crate) struct Components {
    pub(crate) config: McpConfig,
    /// The tools this server offers, each with its kind.
    pub(crate) registry: Registry,
    /// Who reaches which backend with which key.
    pub(crate) connections: Arc<Connections>,
    /// Session ownership, storage, tracked sandboxes and their leases.
    pub(crate) sessions: Sessions,
    /// Releases sandboxes whose lease ran out.
    sweeper: Arc<Sweeper>,
    /// Every sealed record (key rotation goes over all of them).
    secrets: Arc<Secrets>,
}

/// The MCP server's shared state. Cheap to clone; one per process.
#[derive(Clone)]
pub struct Mcp {
    pub(crate) components: Arc<Components>,
}

impl std::fmt::Debug for Mcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mcp")
            .field("toolset", &self.components.config.toolset)
            .finish_non_exhaustive()
    }
}

impl Mcp {
    /// Opens (creating if needed) the state under `<state_dir>/mcp/`.
    pub fn open(config: McpConfig) -> Result<Self, McpError> {
        let dir = config.mcp_dir();
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&dir)
            .map_err(|error| McpError::io("creating the MCP state directory", error))?;
        let store = Arc::new(Store::open(&dir.join("mcp.sqlite3"))?);
        let secrets = Arc::new(Secrets::new(store.clone(), Vault::load(&dir.join("kek"))?));
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|error| McpError::Transport(error.to_string()))?;
        let connections = Arc::new(Connections::new(
            store.clone(),
            secrets.clone(),
            http,
            &config.public_url,
        ));
        let sessions = Sessions::new(store.clone(), secrets.clone(), dir, config.lease.ttl);
        let sweeper = Arc::new(Sweeper::new(
            store,
            connections.clone(),
            config.lease.clone(),
        ));
        Ok(Self {
            components: Arc::new(Components {
                registry: Registry::new(config.toolset),
                config,
                connections,
                sessions,
                sweeper,
                secrets,
            }),
        })
    }

    pub fn config(&self) -> &McpConfig {
        &self.components.config
    }

    /// The storage area of one session: files here can be copied into sandboxes with
    /// `upload_files` (`session_path` is relative to it).
    pub fn session_storage_dir(&self, session_id: &str) -> PathBuf {
        self.components.sessions.storage_dir(session_id)
    }

    /// Connects `identity` to an E2B-compatible API: validates the key with a cheap
    /// authenticated GET, then stores it sealed. `sandbox_url` optionally fixes where envd
    /// is reached (header routing); by default a plain-http API is also the sandbox URL
    /// and an https one reaches envd at `49983-<id>.<domain>`.
    pub async fn connect(
        &self,
        identity: &str,
        api_url: &str,
        api_key: &str,
        sandbox_url: Option<&str>,
    ) -> Result<(), McpError> {
        self.components
            .connections
            .connect(identity, api_url, api_key, sandbox_url)
            .await
    }

    /// Issues a one-time connect link for `identity`.
    pub fn new_connect_link(&self, identity: &str) -> Result<String, McpError> {
        self.components.connections.new_connect_link(identity)
    }

    /// Adds a new key-encryption key version (key file) and re-encrypts every sealed
    /// record under the newest version with a fresh data key.
    pub fn rotate_kek(&self) -> Result<RotationReport, McpError> {
        self.components.secrets.rotate()
    }

    /// Runs [`Mcp::sweep_once`] every `lease.sweep_interval` until `shutdown` fires.
    pub fn spawn_sweeper(
        &self,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        self.spawn_sweeper_reporting(shutdown, |_| {})
    }

    /// [`Mcp::spawn_sweeper`], handing each pass's report to `reported` (the operator's
    /// metrics count its failures).
    pub fn spawn_sweeper_reporting(
        &self,
        shutdown: tokio_util::sync::CancellationToken,
        reported: impl Fn(&SweepReport) + Send + Sync + 'static,
    ) -> tokio::task::JoinHandle<()> {
        self.components.sweeper.clone().spawn(shutdown, reported)
    }

    /// Releases every sandbox whose lease expired and whose retry time has come.
    pub async fn sweep_once(&self) -> SweepReport {
        self.components.sweeper.sweep_once().await
    }

    fn handler(
        &self,
        identity: Option<String>,
        resolver: Option<Arc<dyn IdentityResolver>>,
    ) -> Handler {
        Handler {
            mcp: self.clone(),
            session_id: uuid::Uuid::new_v4().to_string(),
            identity,
            resolver,
        }
    }

    /// The streamable HTTP MCP service at `/mcp` plus the connect page
    /// (`/mcp/connect/{token}`) and the session storage upload
    /// (`PUT /mcp/sessions/{session_id}/storage/{*path}`). `resolver` names the identity
    /// of every request, and may vouch for its connection (see [`Identity::trusted`]).
    pub fn http_router(&self, resolver: Arc<dyn IdentityResolver>) -> axum::Router {
        use rmcp::transport::streamable_http_server::{
            session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
        };
        let mcp = self.clone();
        let handler_resolver = resolver.clone();
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(self.components.config.allowed_hosts.clone());
        let service = StreamableHttpService::new(
            move || Ok(mcp.handler(None, Some(handler_resolver.clone()))),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        // Every request to `/mcp` needs an identity before it reaches the MCP service, so
        // an unauthenticated client gets a 401 instead of a session it cannot use.
        let guarded = axum::Router::new().route_service("/mcp", service).layer(
            axum::middleware::from_fn_with_state(resolver.clone(), require_identity),
        );
        crate::web::routes(self.clone(), resolver).merge(guarded)
    }

    /// Serves one MCP session for `identity` over a byte stream pair (stdio, a pipe),
    /// with the sweeper running; ends the session and releases its leases when the peer
    /// closes the stream.
    pub async fn serve_session<R, W>(
        &self,
        identity: String,
        session_id: Option<String>,
        reader: R,
        writer: W,
    ) -> Result<(), McpError>
    where
        R: tokio::io::AsyncRead + Send + Unpin + 'static,
        W: tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let sweeper = self.spawn_sweeper(shutdown.clone());
        let mut handler = self.handler(Some(identity.clone()), None);
        if let Some(session_id) = session_id {
            handler.session_id = session_id;
        }
        let session_id = handler.session_id.clone();
        let sessions = &self.components.sessions;
        if !sessions.claim(&session_id, &identity)? {
            shutdown.cancel();
            return Err(McpError::Invalid(
                "this session belongs to another user".into(),
            ));
        }
        let served = async {
            let running = handler
                .serve((reader, writer))
                .await
                .map_err(|error| McpError::Transport(error.to_string()))?;
            running
                .waiting()
                .await
                .map_err(|error| McpError::Transport(error.to_string()))?;
            Ok::<(), McpError>(())
        }
        .await;
        shutdown.cancel();
        let _ = sweeper.await;
        sessions.end(&session_id)?;
        self.sweep_once().await;
        served
    }
}

/// The request `_meta` key naming the berth session a call belongs to. MCP 2026-07-28
/// has no protocol session, so a stateless client that wants its sandboxes tracked apart
/// from its other conversations sends a handle of its own choosing here on every call.
pub const SESSION_META_KEY: &str = "dev.berth/session";

const CLIENT_INFO_META_KEY: &str = "io.modelcontextprotocol/clientInfo";

/// The berth session of one HTTP request: the explicit handle in `_meta` (any protocol
/// revision), else the legacy protocol's `Mcp-Session-Id`, else one session per identity
/// (a stateless client that sends no handle). Handles are namespaced apart from protocol
/// session ids, and either kind belongs to the first identity that used it.
fn http_session_id(
    meta: &rmcp::model::RequestMetaObject,
    headers: &http::HeaderMap,
    identity: &str,
) -> String {
    if let Some(handle) = meta
        .get(SESSION_META_KEY)
        .and_then(serde_json::Value::as_str)
        .filter(|handle| !handle.is_empty())
    {
        return format!("http-handle:{handle}");
    }
    headers
        .get("mcp-session-id")
        .and_then(|value| value.to_str().ok())
        .map(|value| format!("http:{value}"))
        .unwrap_or_else(|| format!("http-identity:{identity}"))
}

/// One MCP session's handler.
#[derive(Clone)]
struct Handler {
    mcp: Mcp,
    session_id: String,
    /// The stdio session's identity; over HTTP every request names its own.
    identity: Option<String>,
    resolver: Option<Arc<dyn IdentityResolver>>,
}

impl Handler {
    fn call_context(&self, context: &RequestContext<RoleServer>) -> Option<CallContext> {
        let parts = context.extensions.get::<http::request::Parts>();
        let Identity { name, trusted } = match (&self.identity, &self.resolver, parts) {
            (Some(identity), _, _) => Identity::named(identity.clone()),
            (None, Some(resolver), Some(parts)) => resolver.identity(parts)?,
            _ => return None,
        };
        let session_id = match parts {
            Some(parts) => http_session_id(&context.meta, &parts.headers, &name),
            None => self.session_id.clone(),
        };
        let harness_id = context
            .peer
            .peer_info()
            .map(|info| {
                (
                    info.client_info.name.clone(),
                    info.client_info.version.clone(),
                )
            })
            .or_else(|| {
                // Stateless requests (2026-07-28) name their client in `_meta` instead.
                let info = context.meta.get(CLIENT_INFO_META_KEY)?;
                Some((
                    info.get("name")?.as_str()?.to_owned(),
                    info.get("version")?.as_str()?.to_owned(),
                ))
            })
            .map(|(name, version)| format!("{name}/{version}"));
        Some(CallContext {
            identity: name,
            trusted,
            session_id,
            harness_id,
        })
    }
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("berth", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "E2B-compatible sandboxes. Create one with e2b_create_sandbox, run commands with \
                 e2b_exec, and delete sandboxes you no longer need. If a tool answers \
                 connection_required, ask the user to open the connect_url.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            self.mcp.components.registry.tools().as_ref().clone(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(call) = self.call_context(&context) else {
            return Ok(call_result(Err(ToolFailure::Message(
                "no user identity for this request".into(),
            )))
            .into());
        };
        let components = &self.mcp.components;
        match components.sessions.claim(&call.session_id, &call.identity) {
            Ok(true) => {}
            Ok(false) => {
                return Ok(call_result(Err(ToolFailure::Message(
                    "this MCP session belongs to another user".into(),
                )))
                .into())
            }
            Err(error) => return Ok(call_result(Err(error.into())).into()),
        }
        let args = request.arguments.unwrap_or_default();
        match tools::dispatch(components, &call, &request.name, args).await {
            Some(result) => Ok(call_result(result).into()),
            None => Err(ErrorData::invalid_params(
                format!("unknown tool {}", request.name),
                None,
            )),
        }
    }
}

/// `berth mcp`: serves MCP over stdin/stdout for `identity` until the client closes
/// stdin, with the lease sweeper running. When the session ends its sandboxes' leases
/// expire and are released before this returns. `session_id` names the session (and its
/// storage area); a random one is used when `None`. Logs must go to stderr.
pub async fn run_stdio(
    config: McpConfig,
    identity: String,
    session_id: Option<String>,
) -> Result<(), McpError> {
    let mcp = Mcp::open(config)?;
    let (stdin, stdout) = rmcp::transport::stdio();
    mcp.serve_session(identity, session_id, stdin, stdout).await
}

/// `berth connect`: reads an API key from stdin and connects `identity` to `api_url`
/// (validated by an authenticated GET; the key is never printed or logged).
pub async fn run_connect(
    config: McpConfig,
    identity: &str,
    api_url: &str,
    sandbox_url: Option<&str>,
) -> Result<(), McpError> {
    use tokio::io::AsyncReadExt;
    let mut key = String::new();
    tokio::io::stdin()
        .read_to_string(&mut key)
        .await
        .map_err(|error| McpError::io("reading the API key from stdin", error))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(McpError::Invalid("no API key on stdin".into()));
    }
    Mcp::open(config)?
        .connect(identity, api_url, key, sandbox_url)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &std::path::Path) -> Mcp {
        Mcp::open(McpConfig::new(dir.to_owned(), "http://127.0.0.1:1")).unwrap()
    }

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Record {
        api_key: String,
    }

    #[test]
    fn rotation_reencrypts_every_record_under_the_new_version() {
        if std::env::var(berth_vault::KEK_ENV).is_ok() {
            panic!("unset {} to run this test", berth_vault::KEK_ENV);
        }
        let dir = tempfile::tempdir().unwrap();
        let mcp = open(dir.path());
        let secrets = &mcp.components.secrets;
        let record = Record {
            api_key: "e2b_1".into(),
        };
        secrets.seal("connection/alice", &record).unwrap();
        secrets.seal("sandbox/alice/i1", &record).unwrap();
        let store = Store::open(&dir.path().join("mcp/mcp.sqlite3")).unwrap();
        let before = store.get_sealed("connection/alice").unwrap().unwrap();
        assert_eq!(before.kek_version, 1);
        let report = mcp.rotate_kek().unwrap();
        assert_eq!(
            report,
            RotationReport {
                kek_version: 2,
                records_reencrypted: 2
            }
        );
        let after = store.get_sealed("connection/alice").unwrap().unwrap();
        assert_eq!(after.kek_version, 2);
        assert_ne!(after.ciphertext, before.ciphertext);
        drop(mcp);
        let reopened = open(dir.path());
        let opened: Record = reopened
            .components
            .secrets
            .open("connection/alice")
            .unwrap()
            .unwrap();
        assert_eq!(opened.api_key, "e2b_1");
    }

    #[test]
    fn http_sessions_come_from_the_handle_then_the_header_then_the_identity() {
        let mut headers = http::HeaderMap::new();
        let mut meta = rmcp::model::RequestMetaObject::default();
        assert_eq!(
            http_session_id(&meta, &headers, "team-a"),
            "http-identity:team-a"
        );
        headers.insert("mcp-session-id", "abc".parse().unwrap());
        assert_eq!(http_session_id(&meta, &headers, "team-a"), "http:abc");
        meta.insert(SESSION_META_KEY.into(), serde_json::json!("chat-7"));
        assert_eq!(
            http_session_id(&meta, &headers, "team-a"),
            "http-handle:chat-7"
        );
        meta.insert(SESSION_META_KEY.into(), serde_json::json!(""));
        assert_eq!(http_session_id(&meta, &headers, "team-a"), "http:abc");
    }

    #[test]
    fn stored_key_is_not_in_the_database_file_in_clear() {
        let dir = tempfile::tempdir().unwrap();
        let mcp = open(dir.path());
        mcp.components
            .secrets
            .seal(
                "connection/alice",
                &Record {
                    api_key: "e2b_cleartextcanary".into(),
                },
            )
            .unwrap();
        drop(mcp);
        for entry in std::fs::read_dir(dir.path().join("mcp")).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap_or_default();
            assert!(!bytes
                .windows(b"cleartextcanary".len())
                .any(|window| window == b"cleartextcanary"));
        }
    }
}
