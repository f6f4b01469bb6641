//! Drives the MCP server library over in-process pipes with rmcp's own client: tool
//! lists per tool set, the connection-required result, and unknown tools.

use berth_mcp::{Mcp, McpConfig, Toolset};
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

struct Server {
    client: RunningService<RoleClient, ()>,
    task: tokio::task::JoinHandle<Result<(), berth_mcp::McpError>>,
    _state: tempfile::TempDir,
}

async fn start(toolset: Toolset) -> Server {
    let state = tempfile::tempdir().unwrap();
    let mut config = McpConfig::new(state.path().to_owned(), "http://127.0.0.1:9");
    config.toolset = toolset;
    let mcp = Mcp::open(config).unwrap();
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let (server_read, server_write) = tokio::io::split(server_io);
    let task = tokio::spawn(async move {
        mcp.serve_session(
            "alice".into(),
            Some("pipe-session".into()),
            server_read,
            server_write,
        )
        .await
    });
    let client = ().serve(client_io).await.unwrap();
    Server {
        client,
        task,
        _state: state,
    }
}

impl Server {
    async fn stop(self) {
        self.client.cancel().await.unwrap();
        self.task.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn tool_counts_per_toolset() {
    for (toolset, count) in [
        (Toolset::Session, 6),
        (Toolset::Connector, 38),
        (Toolset::All, 42),
    ] {
        let server = start(toolset).await;
        let tools = server.client.list_all_tools().await.unwrap();
        assert_eq!(tools.len(), count, "{toolset:?}");
        server.stop().await;
    }
}

#[tokio::test]
async fn without_a_connection_tools_answer_with_a_connect_link() {
    let server = start(Toolset::All).await;
    for name in [
        "e2b_create_sandbox",
        "e2b_list_sandboxes",
        "e2b_get_sandbox",
    ] {
        let arguments = json!({"sandbox_id": "iabc"});
        let mut request = CallToolRequestParams::new(name);
        if name == "e2b_get_sandbox" {
            request = request.with_arguments(arguments.as_object().unwrap().clone());
        }
        let result = server.client.call_tool(request).await.unwrap();
        assert_eq!(result.is_error, Some(true), "{name}");
        let structured = result.structured_content.unwrap();
        assert_eq!(structured["connection_required"], Value::Bool(true));
        assert!(structured["connect_url"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:9/mcp/connect/"));
    }
    server.stop().await;
}

#[tokio::test]
async fn bad_calls_are_reported_not_crashed() {
    let server = start(Toolset::Connector).await;
    let unknown = server
        .client
        .call_tool(CallToolRequestParams::new("e2b_does_not_exist"))
        .await;
    assert!(unknown.is_err());
    let missing = server
        .client
        .call_tool(CallToolRequestParams::new("e2b_kill_sandbox"))
        .await
        .unwrap();
    assert_eq!(missing.is_error, Some(true));
    assert!(missing.structured_content.unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("sandbox_id"));
    server.stop().await;
}
