//! `/mcp` end to end without root: the real control plane on the host runtime
//! (`berth_server::testing::HostApi`), the agent tools mounted beside it as `berth up`
//! mounts them, and an MCP client speaking JSON-RPC over streamable HTTP. The caller's
//! berth API key is its trusted backend connection: no connect step.

use std::sync::Arc;

use berth_mcp::{Identity, IdentityResolver, Mcp, McpConfig, TrustedConnection};
use berth_server::testing::HostApi;
use berth_store::Store;
use serde_json::{json, Value};

/// Identifies a request by its berth API key, as `berth up` does.
struct ApiKeys {
    store: Arc<Store>,
    url: String,
}

impl IdentityResolver for ApiKeys {
    fn identity(&self, parts: &http::request::Parts) -> Option<Identity> {
        let key = parts.headers.get("x-api-key")?.to_str().ok()?;
        let (team, _) = self.store.authenticate(key).ok()??;
        Some(Identity::trusted(
            format!("team:{}", team.id),
            TrustedConnection::new(&self.url, key),
        ))
    }
}

async fn start(state: &std::path::Path) -> HostApi {
    let state = state.to_path_buf();
    HostApi::start(None, move |store, url| {
        let mcp = Mcp::open(McpConfig::new(state, url)).expect("open the agent tools");
        mcp.http_router(Arc::new(ApiKeys {
            store,
            url: url.to_string(),
        }))
    })
    .await
}

/// A minimal MCP client: one session over streamable HTTP.
struct Client {
    http: reqwest::Client,
    url: String,
    key: String,
    session: Option<String>,
    next_id: u64,
}

impl Client {
    fn new(url: &str, key: &str) -> Client {
        Client {
            http: reqwest::Client::new(),
            url: format!("{url}/mcp"),
            key: key.to_string(),
            session: None,
            next_id: 1,
        }
    }

    async fn post(&mut self, message: &Value) -> reqwest::Response {
        let mut request = self
            .http
            .post(&self.url)
            .header("x-api-key", &self.key)
            .header("accept", "application/json, text/event-stream")
            .json(message);
        if let Some(session) = &self.session {
            request = request.header("mcp-session-id", session);
        }
        request.send().await.expect("POST /mcp")
    }

    /// A request and its result (from a JSON body or the first SSE data line).
    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let response = self
            .post(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        assert!(
            response.status().is_success(),
            "{method}: {}",
            response.status()
        );
        if let Some(session) = response.headers().get("mcp-session-id") {
            self.session = Some(session.to_str().unwrap().to_string());
        }
        let text = response.text().await.unwrap();
        // A JSON body, or an event stream whose data lines hold messages (an empty one
        // primes the stream for resumption).
        let message: Value = std::iter::once(text.as_str())
            .chain(text.lines().filter_map(|line| line.strip_prefix("data:")))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .find(|message| message["id"] == id)
            .unwrap_or_else(|| panic!("{method}: no answer in {text:?}"));
        assert!(message.get("error").is_none(), "{method}: {message}");
        message["result"].clone()
    }

    async fn initialize(&mut self) {
        self.call(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "berth-test", "version": "0"}}),
        )
        .await;
        let ack = self
            .post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert!(ack.status().is_success());
    }

    async fn tool(&mut self, name: &str, arguments: Value) -> Value {
        let result = self
            .call("tools/call", json!({"name": name, "arguments": arguments}))
            .await;
        assert_ne!(result["isError"], true, "{name}: {result}");
        result["structuredContent"].clone()
    }
}

#[tokio::test]
async fn tools_list_and_a_session_tool_call_on_the_callers_key() {
    let state = tempfile::tempdir().unwrap();
    let api = start(state.path()).await;
    let mut client = Client::new(&api.url, &api.key_a);
    client.initialize().await;
    let listed = client.call("tools/list", json!({})).await;
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    for expected in [
        "e2b_create_sandbox",
        "e2b_exec",
        "e2b_update_sandbox_network",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }

    let created = client
        .tool("e2b_create_sandbox", json!({"title": "mcp-host-runtime"}))
        .await;
    let sandbox = created["sandbox_id"]
        .as_str()
        .expect("sandbox_id")
        .to_string();
    let ran = client
        .tool(
            "e2b_exec",
            json!({"sandbox_id": sandbox, "command": "echo from-the-agent", "cwd": "/tmp"}),
        )
        .await;
    assert_eq!(ran["exit_code"], 0, "{ran}");
    assert_eq!(ran["stdout"].as_str().unwrap().trim(), "from-the-agent");
    // The sandbox belongs to the key's team and to no other.
    assert!(api
        .store
        .live_sandbox(
            &api.store.authenticate(&api.key_a).unwrap().unwrap().0.id,
            &sandbox
        )
        .unwrap()
        .is_some());
    let other_team = api.store.authenticate(&api.key_b).unwrap().unwrap().0;
    assert!(api
        .store
        .live_sandbox(&other_team.id, &sandbox)
        .unwrap()
        .is_none());
    client
        .tool(
            "e2b_manage_sandbox",
            json!({"sandbox_id": sandbox, "action": "delete"}),
        )
        .await;
}

#[tokio::test]
async fn a_request_without_a_key_is_a_401() {
    let state = tempfile::tempdir().unwrap();
    let api = start(state.path()).await;
    let response = reqwest::Client::new()
        .post(format!("{}/mcp", api.url))
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
}
