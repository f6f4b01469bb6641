use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use berth_client::{ApiClient, ClientError, EnvdClient, EnvdEndpoint};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::config::{McpConfig, Toolset};
use crate::error::McpError;
use crate::store::{unix_now, ConnectionRow, Store};
use crate::tools::{self, ToolSpec};
use crate::vault::Vault;

/// JSON-RPC error code (server-defined range) of a request to `/mcp` without identity.
const UNAUTHENTICATED_CODE: i64 = -32001;

/// How long a connect link stays usable.
const CONNECT_LINK_SECONDS: i64 = 30 * 60;

/// The MCP server's shared state: configuration, state database, vault, tool table.
/// Cheap to clone; one per process.
#[derive(Clone)]
pub struct Mcp {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: McpConfig,
    pub(crate) store: Store,
    pub(crate) vault: RwLock<Vault>,
    pub(crate) http: reqwest::Client,
    tools: Arc<Vec<Tool>>,
    specs: HashMap<String, ToolSpec>,
    /// (session, identity) pairs already recorded, so calls skip the database write.
    claimed_sessions: Mutex<HashSet<(String, String)>>,
    /// When each sandbox's own timeout was last extended (see `Mcp::touch`).
    pub(crate) last_extended: Mutex<HashMap<String, Instant>>,
}

impl Inner {
    pub(crate) fn specs_get(&self, name: &str) -> Option<&ToolSpec> {
        self.specs.get(name)
    }
}

impl std::fmt::Debug for Mcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mcp")
            .field("toolset", &self.inner.config.toolset)
            .finish_non_exhaustive()
    }
}

/// What `rotate_kek` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RotationReport {
    pub kek_version: u32,
    pub records_reencrypted: usize,
}

/// Names the identity behind an HTTP request to `/mcp` (and the storage upload route).
/// The server supplies one that matches its own authentication.
pub trait IdentityResolver: Send + Sync + 'static {
    fn identity(&self, parts: &http::request::Parts) -> Option<String>;

    /// What a request without an identity lacks, for the 401 answer of `/mcp`.
    fn unauthenticated_message(&self) -> String {
        "this request carries no identity".into()
    }
}

/// Takes the identity from a request header (for deployments where a trusted front end
/// authenticates users and sets it).
#[derive(Debug, Clone)]
pub struct HeaderIdentity(pub http::HeaderName);

impl Default for HeaderIdentity {
    fn default() -> Self {
        Self(http::HeaderName::from_static("x-berth-user"))
    }
}

impl IdentityResolver for HeaderIdentity {
    fn identity(&self, parts: &http::request::Parts) -> Option<String> {
        parts
            .headers
            .get(&self.0)
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
            .filter(|value| !value.is_empty())
            .map(str::to_owned)
    }

    fn unauthenticated_message(&self) -> String {
        format!("missing {} header", self.0)
    }
}

/// A live connection of one identity, resolved fresh for every tool call.
pub(crate) struct Connected {
    pub(crate) api: ApiClient,
    pub(crate) api_url: String,
    pub(crate) sandbox_url: Option<String>,
}

impl Connected {
    /// How to reach envd: an explicit sandbox URL; a plain-http API (self-hosted, header
    /// routing on the API's URL as with `E2B_SANDBOX_URL`); else the sandbox's domain.
    pub(crate) fn envd(
        &self,
        http: &reqwest::Client,
        sandbox_id: &str,
        domain: Option<&str>,
        access_token: Option<String>,
    ) -> EnvdClient {
        let endpoint = match (&self.sandbox_url, domain) {
            (Some(url), _) => EnvdEndpoint::SandboxUrl(url.clone()),
            (None, _) if self.api_url.starts_with("http://") => {
                EnvdEndpoint::SandboxUrl(self.api_url.clone())
            }
            (None, Some(domain)) if !domain.is_empty() => EnvdEndpoint::Domain(domain.to_owned()),
            (None, _) => EnvdEndpoint::SandboxUrl(self.api_url.clone()),
        };
        EnvdClient::new(http.clone(), &endpoint, sandbox_id, access_token)
    }
}

/// Who is calling and in which session.
#[derive(Debug, Clone)]
pub(crate) struct CallContext {
    pub(crate) identity: String,
    pub(crate) session_id: String,
    pub(crate) harness_id: Option<String>,
}

/// Why a tool call did not succeed; each becomes a tool result with `isError: true`.
#[derive(Debug)]
pub(crate) enum ToolFailure {
    /// No connection for this identity: carries the one-time connect link.
    ConnectionRequired { connect_url: String },
    /// The API or envd answered with an error: passed through unchanged.
    Api { status: u16, body: Value },
    /// Anything else, as a message safe to show (never contains a key).
    Message(String),
}

impl From<ClientError> for ToolFailure {
    fn from(error: ClientError) -> Self {
        match error {
            ClientError::Api { status, body } => ToolFailure::Api { status, body },
            other => ToolFailure::Message(other.to_string()),
        }
    }
}

impl From<McpError> for ToolFailure {
    fn from(error: McpError) -> Self {
        match error {
            McpError::Client(client) => client.into(),
            other => ToolFailure::Message(other.to_string()),
        }
    }
}

pub(crate) type ToolResult = Result<Value, ToolFailure>;

fn success_result(value: Value) -> CallToolResult {
    let text = serde_json::to_string(&value).unwrap_or_default();
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(value);
    result
}

fn failure_result(failure: ToolFailure) -> CallToolResult {
    let value = match failure {
        ToolFailure::ConnectionRequired { connect_url } => json!({
            "connection_required": true,
            "connect_url": connect_url,
            "message": format!(
                "No E2B-compatible API key is connected for this user. Open {connect_url} to \
                 connect one (or run `berth connect`), then retry."
            ),
        }),
        ToolFailure::Api { status, body } => json!({
            "error": { "status": status, "body": body },
        }),
        ToolFailure::Message(message) => json!({ "error": { "message": message } }),
    };
    let text = serde_json::to_string(&value).unwrap_or_default();
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    result.structured_content = Some(value);
    result
}

impl Mcp {
    /// Opens (creating if needed) the state under `<state_dir>/mcp/`.
    pub fn open(config: McpConfig) -> Result<Self, McpError> {
        let dir = config.mcp_dir();
        std::fs::create_dir_all(&dir)
            .map_err(|error| McpError::io("creating the MCP state directory", error))?;
        let store = Store::open(&dir.join("mcp.sqlite3"))?;
        let vault = Vault::load(&dir.join("kek"))?;
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .map_err(|error| McpError::Transport(error.to_string()))?;
        let specs = tools::specs_for(config.toolset)
            .into_iter()
            .map(|spec| (spec.name.clone(), spec))
            .collect();
        let tools = tools::tool_list(config.toolset);
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                store,
                vault: RwLock::new(vault),
                http,
                tools,
                specs,
                claimed_sessions: Mutex::new(HashSet::new()),
                last_extended: Mutex::new(HashMap::new()),
            }),
        })
    }

    pub fn config(&self) -> &McpConfig {
        &self.inner.config
    }

    /// The storage area of one session: files here can be copied into sandboxes with
    /// `upload_files` (`session_path` is relative to it).
    pub fn session_storage_dir(&self, session_id: &str) -> PathBuf {
        let digest = Sha256::digest(session_id.as_bytes());
        let name: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        self.inner
            .config
            .mcp_dir()
            .join("sessions")
            .join(name)
            .join("storage")
    }

    /// Records that `session_id` belongs to `identity` (once per process); false if the
    /// session belongs to someone else.
    fn claim_session(&self, session_id: &str, identity: &str) -> Result<bool, McpError> {
        let key = (session_id.to_owned(), identity.to_owned());
        let mut claimed = self
            .inner
            .claimed_sessions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if claimed.contains(&key) {
            return Ok(true);
        }
        let owned = self.inner.store.claim_session(session_id, identity)?;
        if owned {
            claimed.insert(key);
        }
        Ok(owned)
    }

    pub(crate) fn seal_json(&self, context: &str, value: &Value) -> Result<(), McpError> {
        let plaintext = serde_json::to_vec(value).map_err(|e| McpError::Vault(e.to_string()))?;
        let record = self
            .inner
            .vault
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .seal(context, &plaintext)?;
        self.inner.store.put_sealed(context, &record)
    }

    pub(crate) fn open_json(&self, context: &str) -> Result<Option<Value>, McpError> {
        let Some(record) = self.inner.store.get_sealed(context)? else {
            return Ok(None);
        };
        let plaintext = self
            .inner
            .vault
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .open(context, &record)?;
        serde_json::from_slice(&plaintext)
            .map(Some)
            .map_err(|error| McpError::Vault(error.to_string()))
    }

    /// Connects `identity` to an E2B-compatible API: validates the key with a cheap
    /// authenticated GET, then stores it sealed. `sandbox_url` optionally fixes where envd
    /// is reached (header routing); see `Connected::envd` for the default.
    pub async fn connect(
        &self,
        identity: &str,
        api_url: &str,
        api_key: &str,
        sandbox_url: Option<&str>,
    ) -> Result<(), McpError> {
        let api_url = api_url.trim().trim_end_matches('/');
        if !(api_url.starts_with("http://") || api_url.starts_with("https://")) {
            return Err(McpError::Invalid(
                "the API URL must start with http:// or https://".into(),
            ));
        }
        let api = ApiClient::with_http(self.inner.http.clone(), api_url, api_key.trim());
        match api.list_sandboxes(Some(1), None).await {
            Ok(_) => {}
            Err(ClientError::Api { status, .. }) => {
                return Err(McpError::KeyRejected {
                    api_url: api_url.to_owned(),
                    status,
                })
            }
            Err(other) => return Err(other.into()),
        }
        self.seal_json(
            &connection_context(identity),
            &json!({ "api_key": api_key.trim() }),
        )?;
        self.inner.store.put_connection(
            identity,
            &ConnectionRow {
                api_url: api_url.to_owned(),
                sandbox_url: sandbox_url
                    .map(|url| url.trim().trim_end_matches('/').to_owned())
                    .filter(|url| !url.is_empty()),
            },
        )?;
        tracing::info!(identity, api_url, "MCP connection stored");
        Ok(())
    }

    pub(crate) fn connection(&self, identity: &str) -> Result<Option<Connected>, McpError> {
        let Some(row) = self.inner.store.get_connection(identity)? else {
            return Ok(None);
        };
        let Some(secret) = self.open_json(&connection_context(identity))? else {
            return Ok(None);
        };
        let api_key = secret["api_key"].as_str().unwrap_or_default();
        Ok(Some(Connected {
            api: ApiClient::with_http(self.inner.http.clone(), &row.api_url, api_key),
            api_url: row.api_url,
            sandbox_url: row.sandbox_url,
        }))
    }

    /// The identity's connection, or the "connection required" failure with a fresh
    /// one-time link.
    pub(crate) fn require_connection(&self, identity: &str) -> Result<Connected, ToolFailure> {
        if let Some(connected) = self.connection(identity)? {
            return Ok(connected);
        }
        Err(ToolFailure::ConnectionRequired {
            connect_url: self.new_connect_link(identity)?,
        })
    }

    /// Issues a one-time connect link for `identity`.
    pub fn new_connect_link(&self, identity: &str) -> Result<String, McpError> {
        let mut token_bytes = [0u8; 24];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut token_bytes);
        let token: String = token_bytes.iter().map(|b| format!("{b:02x}")).collect();
        self.inner.store.put_connect_token(
            &token_hash(&token),
            identity,
            unix_now() + CONNECT_LINK_SECONDS,
        )?;
        Ok(format!(
            "{}/mcp/connect/{token}",
            self.inner.config.public_url
        ))
    }

    /// Adds a new key-encryption key version (key file) and re-encrypts every sealed
    /// record under the newest version with a fresh data key.
    pub fn rotate_kek(&self) -> Result<RotationReport, McpError> {
        let mut vault = self
            .inner
            .vault
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if std::env::var(crate::vault::KEK_ENV).is_err() {
            vault.add_version()?;
        }
        let mut records_reencrypted = 0;
        for context in self.inner.store.sealed_contexts()? {
            let Some(record) = self.inner.store.get_sealed(&context)? else {
                continue;
            };
            let plaintext = vault.open(&context, &record)?;
            self.inner
                .store
                .put_sealed(&context, &vault.seal(&context, &plaintext)?)?;
            records_reencrypted += 1;
        }
        Ok(RotationReport {
            kek_version: vault.current_version(),
            records_reencrypted,
        })
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
    /// (`PUT /mcp/sessions/{session_id}/storage/{*path}`).
    pub fn http_router(&self, resolver: Arc<dyn IdentityResolver>) -> axum::Router {
        use rmcp::transport::streamable_http_server::{
            session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
        };
        let mcp = self.clone();
        let handler_resolver = resolver.clone();
        let config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(self.inner.config.allowed_hosts.clone());
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

    pub(crate) async fn dispatch(
        &self,
        context: &CallContext,
        name: &str,
        args: Map<String, Value>,
    ) -> Option<ToolResult> {
        let spec = self.inner.specs.get(name)?;
        let toolset = self.inner.config.toolset;
        let result = match (name, toolset) {
            ("e2b_create_sandbox", _) => self.create_sandbox(context, &args).await,
            ("e2b_list_sandboxes", Toolset::Session) => self.list_session_sandboxes(context),
            ("e2b_list_sandboxes", Toolset::All) => {
                self.list_sandboxes_merged(context, spec, &args).await
            }
            ("e2b_exec", Toolset::Session | Toolset::All) => self.exec(context, &args).await,
            ("e2b_read_file", Toolset::Session | Toolset::All) => {
                self.read_file(context, &args).await
            }
            ("e2b_write_file", Toolset::Session | Toolset::All) => {
                self.write_file(context, &args).await
            }
            ("e2b_manage_sandbox", Toolset::Session | Toolset::All) => {
                self.manage_sandbox(context, &args).await
            }
            _ => self.call_connector(context, spec, &args).await,
        };
        Some(result)
    }
}

/// Answers 401 with a JSON-RPC error (which MCP clients surface as the request's error)
/// when the resolver finds no identity in the request.
async fn require_identity(
    axum::extract::State(resolver): axum::extract::State<Arc<dyn IdentityResolver>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (parts, body) = request.into_parts();
    if resolver.identity(&parts).is_some() {
        return next
            .run(axum::extract::Request::from_parts(parts, body))
            .await;
    }
    let error = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": UNAUTHENTICATED_CODE, "message": resolver.unauthenticated_message()},
    });
    (http::StatusCode::UNAUTHORIZED, axum::Json(error)).into_response()
}

pub(crate) fn connection_context(identity: &str) -> String {
    format!("connection/{identity}")
}

pub(crate) fn token_hash(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One MCP session's handler.
#[derive(Clone)]
struct Handler {
    mcp: Mcp,
    session_id: String,
    identity: Option<String>,
    resolver: Option<Arc<dyn IdentityResolver>>,
}

impl Handler {
    fn call_context(&self, context: &RequestContext<RoleServer>) -> Option<CallContext> {
        let parts = context.extensions.get::<http::request::Parts>();
        let identity = match (&self.identity, &self.resolver, parts) {
            (Some(identity), _, _) => identity.clone(),
            (None, Some(resolver), Some(parts)) => resolver.identity(parts)?,
            _ => return None,
        };
        // Over HTTP the MCP session header names the session; a request without one
        // (stateless protocol) falls back to one session per identity.
        let session_id = match parts {
            Some(parts) => parts
                .headers
                .get("mcp-session-id")
                .and_then(|value| value.to_str().ok())
                .map(|value| format!("http:{value}"))
                .unwrap_or_else(|| format!("http-identity:{identity}")),
            None => self.session_id.clone(),
        };
        let harness_id = context
            .peer
            .peer_info()
            .map(|info| format!("{}/{}", info.client_info.name, info.client_info.version));
        Some(CallContext {
            identity,
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
            self.mcp.inner.tools.as_ref().clone(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(call) = self.call_context(&context) else {
            return Ok(failure_result(ToolFailure::Message(
                "no user identity for this request".into(),
            ))
            .into());
        };
        match self
            .mcp
            .inner
            .store
            .claim_session(&call.session_id, &call.identity)
        {
            Ok(true) => {}
            Ok(false) => {
                return Ok(failure_result(ToolFailure::Message(
                    "this MCP session belongs to another user".into(),
                ))
                .into())
            }
            Err(error) => return Ok(failure_result(error.into()).into()),
        }
        let args = request.arguments.unwrap_or_default();
        match self.mcp.dispatch(&call, &request.name, args).await {
            Some(Ok(value)) => Ok(success_result(value).into()),
            Some(Err(failure)) => Ok(failure_result(failure).into()),
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

impl Mcp {
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
        if !self.claim_session(&session_id, &identity)? {
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
        self.inner.store.end_session(&session_id)?;
        self.sweep_once().await;
        served
    }
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

/// The default identity for stdio (`--user` unset): the OS user running the process.
pub fn os_user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| format!("uid-{}", current_uid()))
}

fn current_uid() -> u32 {
    // /proc/self/status is enough here and avoids an unsafe getuid() call.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &std::path::Path) -> Mcp {
        Mcp::open(McpConfig::new(dir.to_owned(), "http://127.0.0.1:1")).unwrap()
    }

    #[test]
    fn rotation_reencrypts_every_record_under_the_new_version() {
        if std::env::var(crate::vault::KEK_ENV).is_ok() {
            panic!("unset {} to run this test", crate::vault::KEK_ENV);
        }
        let dir = tempfile::tempdir().unwrap();
        let mcp = open(dir.path());
        mcp.seal_json("connection/alice", &json!({"api_key": "e2b_1"}))
            .unwrap();
        mcp.seal_json("sandbox/alice/i1", &json!({"sandbox_id": "i1"}))
            .unwrap();
        let before = mcp
            .inner
            .store
            .get_sealed("connection/alice")
            .unwrap()
            .unwrap();
        assert_eq!(before.kek_version, 1);
        let report = mcp.rotate_kek().unwrap();
        assert_eq!(
            report,
            RotationReport {
                kek_version: 2,
                records_reencrypted: 2
            }
        );
        let after = mcp
            .inner
            .store
            .get_sealed("connection/alice")
            .unwrap()
            .unwrap();
        assert_eq!(after.kek_version, 2);
        assert_ne!(after.ciphertext, before.ciphertext);
        drop(mcp);
        let reopened = open(dir.path());
        assert_eq!(
            reopened.open_json("connection/alice").unwrap().unwrap()["api_key"],
            "e2b_1"
        );
    }

    #[test]
    fn no_connection_means_a_connect_link_not_a_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let mcp = open(dir.path());
        let Err(ToolFailure::ConnectionRequired { connect_url }) = mcp.require_connection("bob")
        else {
            panic!("expected connection required");
        };
        let token = connect_url
            .strip_prefix("http://127.0.0.1:1/mcp/connect/")
            .unwrap();
        assert_eq!(
            mcp.inner
                .store
                .connect_token_identity(&token_hash(token))
                .unwrap()
                .as_deref(),
            Some("bob")
        );
        assert!(mcp.connection("bob").unwrap().is_none());
    }

    #[test]
    fn stored_key_is_not_in_the_database_file_in_clear() {
        let dir = tempfile::tempdir().unwrap();
        let mcp = open(dir.path());
        mcp.seal_json(
            &connection_context("alice"),
            &json!({"api_key": "e2b_cleartextcanary"}),
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
