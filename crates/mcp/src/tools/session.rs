//! The session tools: sandboxes created here are tracked per MCP session (and per
//! identity) by the sessions component; every use renews the lease and the sandbox's own
//! timeout. One handler per tool, each with its own argument and result types.

use berth_api::{NewSandbox, StringMap};
use berth_client::{ClientError, EnvdClient, ExecError, ExecOutput, ExecRequest, OutputSink};
use berth_envd_proto::connect::{Code, ConnectError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::connector::{rest, wire_body};
use super::output::{line_window, CappedText};
use super::table::ToolSpec;
use super::{
    answer, require_connection, CallContext, LeaseEffect, ToolFailure, ToolKind, ToolResult,
};
use crate::config::{OutputLimits, Toolset};
use crate::connections::Connected;
use crate::server::Components;
use crate::sessions::{storage_path, SandboxState, SandboxStatus};

/// E2B's base template works in the default user's home.
const WORKSPACE_PATH: &str = "/home/user";
const DEFAULT_TEMPLATE: &str = "base";
const SESSION_DEFAULT_TIMEOUT_SECONDS: u64 = 3600;
const CONNECTOR_DEFAULT_TIMEOUT_SECONDS: u64 = 300;
const DEFAULT_EXEC_TIMEOUT_MS: u64 = 300_000;

/// One `upload_files` entry: a session-storage file copied into the new sandbox.
#[derive(Debug, Deserialize)]
pub(crate) struct UploadFile {
    session_path: String,
    sandbox_path: String,
}

/// `e2b_create_sandbox`: the session document's parameters and the connector's (the
/// latter go to the API as the table maps them, see [`wire_body`]).
#[derive(Debug, Deserialize)]
pub(crate) struct CreateSandboxArgs {
    title: Option<String>,
    template: Option<String>,
    template_id: Option<String>,
    timeout: Option<u64>,
    timeout_seconds: Option<u64>,
    env_vars: Option<StringMap>,
    metadata: Option<StringMap>,
    upload_files: Option<Vec<UploadFile>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ExecArgs {
    pub(crate) sandbox_id: String,
    pub(crate) command: String,
    pub(crate) cwd: Option<String>,
    pub(crate) timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ReadFileArgs {
    sandbox_id: String,
    path: String,
    /// Lines skipped (0-based).
    offset: Option<u64>,
    /// At most this many lines.
    limit: Option<u64>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct WriteFileArgs {
    sandbox_id: String,
    path: String,
    content: String,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ManageSandboxArgs {
    sandbox_id: String,
    action: String,
    timeout_seconds: Option<u64>,
}

/// What `e2b_manage_sandbox` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ManageAction {
    Pause,
    Resume,
    Delete,
}

impl ManageAction {
    fn parse(action: &str) -> Result<Self, ToolFailure> {
        match action {
            "pause" => Ok(ManageAction::Pause),
            "resume" => Ok(ManageAction::Resume),
            "delete" => Ok(ManageAction::Delete),
            other => Err(ToolFailure::Message(format!(
                "action must be pause, resume or delete, not {other:?}"
            ))),
        }
    }
}

/// The session tool set's answer to `e2b_create_sandbox`; `all` adds the API's.
#[derive(Serialize, JsonSchema)]
struct CreatedInSession {
    sandbox_id: String,
    status: &'static str,
    template: String,
    workspace_path: String,
    timeout_seconds: u64,
    files_uploaded: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<CreatedDetails>,
}

/// The API's answer to the create as the session tool set shows it: without
/// `envdAccessToken` and `trafficAccessToken`. The session tools keep envd's token in
/// their sealed state and never return it (seed 000); the connector tools that document
/// tokens (`e2b_connect_sandbox`, `e2b_get_sandbox`) still return them (seed 003).
#[derive(Serialize, JsonSchema)]
struct CreatedDetails {
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    alias: Option<String>,
    #[serde(rename = "clientID")]
    client_id: String,
    #[serde(rename = "envdVersion")]
    envd_version: String,
    domain: Option<String>,
}

impl From<berth_api::Sandbox> for CreatedDetails {
    fn from(created: berth_api::Sandbox) -> Self {
        Self {
            sandbox_id: created.sandbox_id,
            template_id: created.template_id,
            alias: created.alias,
            client_id: created.client_id,
            envd_version: created.envd_version,
            domain: created.domain,
        }
    }
}

/// The connector tool set's answer to `e2b_create_sandbox`: a REST result.
#[derive(Serialize)]
struct CreatedByRest {
    status: u16,
    result: berth_api::Sandbox,
}

#[derive(Serialize, JsonSchema)]
struct SessionSandbox {
    sandbox_id: String,
    title: Option<String>,
    template: String,
    status: String,
    created_at_unix: i64,
}

#[derive(Serialize, JsonSchema)]
struct SandboxList<T> {
    count: usize,
    sandboxes: T,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_token: Option<String>,
}

#[derive(Serialize, JsonSchema)]
struct ExecResult {
    sandbox_id: String,
    cwd: String,
    stdout: String,
    stderr: String,
    exit_code: i32,
    success: bool,
    truncated: bool,
    total_lines: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Serialize, JsonSchema)]
struct FileContent {
    sandbox_id: String,
    path: String,
    content: String,
}

#[derive(Serialize, JsonSchema)]
struct FileWritten {
    sandbox_id: String,
    path: String,
    success: bool,
}

#[derive(Serialize, JsonSchema)]
struct Managed {
    sandbox_id: String,
    action: String,
    success: bool,
}

/// The JSON Schema of each session tool's result (`outputSchema`); `None` for kinds
/// this module does not answer.
pub(crate) fn output_schema(kind: ToolKind, toolset: Toolset) -> Option<Value> {
    let schema = match (kind, toolset) {
        (ToolKind::CreateSandbox, Toolset::Connector) => return None,
        (ToolKind::CreateSandbox, _) => schemars::schema_for!(CreatedInSession),
        (ToolKind::ListSessionSandboxes, _) => {
            schemars::schema_for!(SandboxList<Vec<SessionSandbox>>)
        }
        // The session's entries or the API's, by scope.
        (ToolKind::ListSandboxes, _) => schemars::schema_for!(SandboxList<Value>),
        (ToolKind::Exec, _) => schemars::schema_for!(ExecResult),
        (ToolKind::ReadFile, _) => schemars::schema_for!(FileContent),
        (ToolKind::WriteFile, _) => schemars::schema_for!(FileWritten),
        (ToolKind::ManageSandbox, _) => schemars::schema_for!(Managed),
        (ToolKind::Rest(_), _) => return None,
    };
    Some(schema.to_value())
}

struct ExecSink {
    stdout: CappedText,
    stderr: CappedText,
}

impl OutputSink for ExecSink {
    fn stdout(&mut self, chunk: &[u8]) {
        self.stdout.push(chunk);
    }
    fn stderr(&mut self, chunk: &[u8]) {
        self.stderr.push(chunk);
    }
}

fn not_tracked(sandbox_id: &str) -> ToolFailure {
    ToolFailure::Message(format!(
        "sandbox {sandbox_id} is not a live sandbox of this session (see e2b_list_sandboxes)"
    ))
}

/// The session's tracked sandbox's state.
fn tracked(
    mcp: &Components,
    call: &CallContext,
    sandbox_id: &str,
) -> Result<SandboxState, ToolFailure> {
    mcp.sessions
        .tracked(&call.identity, &call.session_id, sandbox_id)?
        .ok_or_else(|| not_tracked(sandbox_id))
}

/// A tracked sandbox of this session with the identity's connection and an envd client.
struct Live {
    state: SandboxState,
    connected: Connected,
    envd: EnvdClient,
}

/// A tracked sandbox of this session, ready for use; the lease (and timeout) is renewed.
fn use_sandbox(
    mcp: &Components,
    call: &CallContext,
    sandbox_id: &str,
) -> Result<Live, ToolFailure> {
    let state = tracked(mcp, call, sandbox_id)?;
    let connected = require_connection(mcp, call)?;
    mcp.sessions.touch(&call.identity, &connected.api, &state);
    let envd = envd_of(mcp, &connected, &state);
    Ok(Live {
        state,
        connected,
        envd,
    })
}

/// Whether an envd call failed because no running sandbox answers for the id: the
/// sandbox proxy's 502 (E2B's "The sandbox was not found").
fn sandbox_not_running(error: &ClientError) -> bool {
    error.status() == Some(502)
}

/// envd found no running sandbox behind a tracked id: asks the API what became of it.
/// A paused sandbox is resumed, as E2B's connect does, and `live` is updated for a
/// retry (`Ok(())`). A sandbox the API no longer knows is marked deleted and the agent
/// gets [`ToolFailure::SandboxGone`]; one the API says is running is a real envd failure
/// and `failed` is returned as it came.
async fn revive(
    mcp: &Components,
    call: &CallContext,
    live: &mut Live,
    failed: ClientError,
) -> Result<(), ToolFailure> {
    let sandbox_id = live.state.sandbox_id.clone();
    let path = format!("/sandboxes/{}", berth_client::encode_segment(&sandbox_id));
    let details = live
        .connected
        .api
        .request(reqwest::Method::GET, &path, &[], None)
        .await;
    match details {
        Ok(details) if details.body["state"] == "paused" => {
            resume(mcp, call, &live.connected, &mut live.state).await?;
            live.envd = envd_of(mcp, &live.connected, &live.state);
            tracing::info!(%sandbox_id, "resumed a paused sandbox for a session tool");
            Ok(())
        }
        Ok(_) => Err(failed.into()),
        Err(error) if error.status() == Some(404) => {
            mcp.sessions
                .set_status(&call.identity, &sandbox_id, SandboxStatus::Deleted)?;
            Err(ToolFailure::SandboxGone { sandbox_id })
        }
        Err(error) => Err(error.into()),
    }
}

/// Resumes (or extends) a tracked sandbox through the API's connect and records its new
/// token, domain, status and lease.
async fn resume(
    mcp: &Components,
    call: &CallContext,
    connected: &Connected,
    state: &mut SandboxState,
) -> Result<(), ToolFailure> {
    let sessions = &mcp.sessions;
    let resumed = connected
        .api
        .connect_sandbox(&state.sandbox_id, state.timeout_seconds)
        .await?;
    if let Some(token) = resumed.envd_access_token {
        state.envd_access_token = Some(token);
    }
    if let Some(domain) = resumed.domain {
        state.domain = Some(domain);
    }
    sessions.save_state(&call.identity, state)?;
    sessions.set_status(&call.identity, &state.sandbox_id, SandboxStatus::Running)?;
    sessions.renew_lease(&call.identity, &state.sandbox_id)?;
    Ok(())
}

fn envd_of(mcp: &Components, connected: &Connected, state: &SandboxState) -> EnvdClient {
    connected.envd(
        mcp.connections.http(),
        &state.sandbox_id,
        state.domain.as_deref(),
        state.envd_access_token.clone(),
    )
}

pub(crate) async fn create_sandbox(
    mcp: &Components,
    call: &CallContext,
    spec: &ToolSpec,
    args: CreateSandboxArgs,
    raw_args: &Map<String, Value>,
) -> ToolResult {
    let toolset = mcp.registry.toolset();
    let connected = require_connection(mcp, call)?;
    let template = args
        .template_id
        .or(args.template)
        .unwrap_or_else(|| DEFAULT_TEMPLATE.to_owned());
    let default_timeout = match toolset {
        Toolset::Connector => CONNECTOR_DEFAULT_TIMEOUT_SECONDS,
        Toolset::Session | Toolset::All => SESSION_DEFAULT_TIMEOUT_SECONDS,
    };
    let timeout_seconds = args
        .timeout
        .or(args.timeout_seconds)
        .unwrap_or(default_timeout);

    let mut metadata = args.metadata.unwrap_or_default();
    let ownership = [
        ("berth.session_id", Some(call.session_id.clone())),
        ("berth.agent_id", mcp.config.agent_id.clone()),
        ("berth.org_id", mcp.config.org_id.clone()),
        ("berth.harness_id", call.harness_id.clone()),
        ("berth.title", args.title.clone()),
    ];
    for (key, value) in ownership {
        if let Some(value) = value {
            metadata.insert(key.into(), value);
        }
    }
    // The table's REST parameters in their wire form (network, volume mounts, …), then
    // what this tool decides itself.
    let mut body = wire_body(spec, raw_args);
    body.insert("templateID".into(), Value::String(template.clone()));
    let mut new_sandbox: NewSandbox = serde_json::from_value(Value::Object(body))
        .map_err(|error| ToolFailure::Message(format!("invalid sandbox parameters: {error}")))?;
    new_sandbox.timeout = Some(timeout_seconds.min(i32::MAX as u64) as i64);
    new_sandbox.secure = Some(true);
    if args.env_vars.is_some() {
        new_sandbox.env_vars = args.env_vars;
    }
    new_sandbox.metadata = Some(metadata);

    let created = connected.api.create_sandbox(&new_sandbox).await?;
    let state = SandboxState {
        sandbox_id: created.sandbox_id.clone(),
        domain: created.domain.clone(),
        envd_access_token: created.envd_access_token.clone(),
        workspace_path: WORKSPACE_PATH.to_owned(),
        timeout_seconds,
    };
    mcp.sessions.track(
        &call.identity,
        &call.session_id,
        args.title,
        &template,
        &state,
    )?;
    mcp.connections.remember(&call.identity, &connected)?;
    tracing::info!(sandbox_id = %state.sandbox_id, session_id = %call.session_id, "sandbox created via MCP");

    let uploads = args.upload_files.unwrap_or_default();
    upload_session_files(mcp, call, &connected, &state, &uploads).await?;
    match toolset {
        Toolset::Connector => answer(&CreatedByRest {
            status: 201,
            result: created,
        }),
        Toolset::Session | Toolset::All => answer(&CreatedInSession {
            sandbox_id: state.sandbox_id,
            status: SandboxStatus::Running.as_str(),
            template,
            workspace_path: state.workspace_path,
            timeout_seconds,
            files_uploaded: uploads.len(),
            sandbox: (toolset == Toolset::All).then(|| created.into()),
        }),
    }
}

async fn upload_session_files(
    mcp: &Components,
    call: &CallContext,
    connected: &Connected,
    state: &SandboxState,
    uploads: &[UploadFile],
) -> Result<(), ToolFailure> {
    if uploads.is_empty() {
        return Ok(());
    }
    let root = mcp.sessions.storage_dir(&call.session_id);
    let envd = envd_of(mcp, connected, state);
    for upload in uploads {
        let source = storage_path(&root, &upload.session_path).ok_or_else(|| {
            ToolFailure::Message(format!(
                "session path {:?} must be a relative path inside session storage",
                upload.session_path.trim_start_matches('/')
            ))
        })?;
        let content = tokio::fs::read(&source).await.map_err(|error| {
            ToolFailure::Message(format!(
                "sandbox {} was created, but session file {:?} could not be read: {error}",
                state.sandbox_id, upload.session_path
            ))
        })?;
        envd.write_file(&upload.sandbox_path, content).await?;
    }
    Ok(())
}

pub(crate) fn list_session_sandboxes(mcp: &Components, call: &CallContext) -> ToolResult {
    // Every E2B operation needs the user's own connection, even one answered locally.
    require_connection(mcp, call)?;
    let sandboxes: Vec<SessionSandbox> = mcp
        .sessions
        .sandboxes(&call.identity, &call.session_id)?
        .into_iter()
        .map(|row| SessionSandbox {
            sandbox_id: row.sandbox_id,
            title: row.title,
            template: row.template,
            status: row.status,
            created_at_unix: row.created_at,
        })
        .collect();
    answer(&SandboxList {
        count: sandboxes.len(),
        sandboxes,
        next_token: None,
    })
}

/// The merged `e2b_list_sandboxes`: `scope=session` (the default without filters) or
/// `scope=project` (or any filter) for the API's list.
pub(crate) async fn list_sandboxes(
    mcp: &Components,
    call: &CallContext,
    spec: &ToolSpec,
    mut filters: Map<String, Value>,
) -> ToolResult {
    let scope = filters.remove("scope");
    let has_filters = filters.values().any(|value| !value.is_null());
    let project = match scope.as_ref().and_then(Value::as_str) {
        Some("project") => true,
        Some("session") => false,
        Some(other) => {
            return Err(ToolFailure::Message(format!(
                "scope must be session or project, not {other:?}"
            )))
        }
        None => has_filters,
    };
    if !project {
        return list_session_sandboxes(mcp, call);
    }
    let listed = rest(mcp, call, spec, LeaseEffect::Renew, &filters).await?;
    answer(&SandboxList {
        count: listed.result.as_array().map_or(0, Vec::len),
        sandboxes: listed.result,
        next_token: listed.next_token,
    })
}

pub(crate) async fn exec(mcp: &Components, call: &CallContext, args: ExecArgs) -> ToolResult {
    let timeout_ms = args.timeout_ms.unwrap_or(DEFAULT_EXEC_TIMEOUT_MS);
    let mut live = use_sandbox(mcp, call, &args.sandbox_id)?;
    let cwd = args
        .cwd
        .unwrap_or_else(|| live.state.workspace_path.clone());
    let limits = mcp.config.output_limits;
    let mut sink = ExecSink {
        stdout: CappedText::new(limits),
        stderr: CappedText::new(limits),
    };
    let request = ExecRequest {
        command: args.command,
        cwd: Some(cwd.clone()),
        envs: Default::default(),
        timeout_ms: (timeout_ms > 0).then_some(timeout_ms),
    };
    // A 502 comes before any output, so the sink is still empty for the retry.
    let ended = match live.envd.exec(&request, &mut sink).await {
        Err(error) if sandbox_not_running(&error) => {
            revive(mcp, call, &mut live, error).await?;
            live.envd.exec(&request, &mut sink).await
        }
        ended => ended,
    };
    let ended = match ended {
        Ok(ended) => ended,
        // envd ends the stream at the deadline; this only fires when that end never came.
        Err(ClientError::Transport(error)) if error.is_timeout() => ExecOutput {
            exit_code: None,
            error: Some(ExecError::Stream(ConnectError::new(
                Code::DeadlineExceeded,
                "no answer from envd",
            ))),
        },
        Err(error) => return Err(error.into()),
    };
    let truncated = sink.stdout.truncated() || sink.stderr.truncated();
    let total_lines = sink.stdout.total_lines() + sink.stderr.total_lines();
    let exit_code = ended.exit_code.unwrap_or(-1);
    answer(&ExecResult {
        sandbox_id: args.sandbox_id,
        cwd,
        stdout: sink.stdout.finish(),
        stderr: sink.stderr.finish(),
        exit_code,
        success: exit_code == 0 && ended.error.is_none(),
        truncated,
        total_lines,
        error: ended.error.map(|error| exec_error_text(&error, timeout_ms)),
    })
}

/// What the agent reads about a command that did not simply exit: a timeout in the
/// words of its own `timeout_ms`, anything else as envd said it.
fn exec_error_text(error: &ExecError, timeout_ms: u64) -> String {
    match error {
        ExecError::Stream(stream) if stream.code == Code::DeadlineExceeded => format!(
            "timed out after {timeout_ms} ms: the command was killed (raise timeout_ms, or 0 \
             for no limit)"
        ),
        other => other.to_string(),
    }
}

pub(crate) async fn read_file(
    mcp: &Components,
    call: &CallContext,
    args: ReadFileArgs,
) -> ToolResult {
    let mut live = use_sandbox(mcp, call, &args.sandbox_id)?;
    let bytes = match live.envd.read_file(&args.path).await {
        Err(error) if sandbox_not_running(&error) => {
            revive(mcp, call, &mut live, error).await?;
            live.envd.read_file(&args.path).await?
        }
        read => read?,
    };
    let offset = args.offset.unwrap_or(0) as usize;
    let limit = args.limit.map(|limit| limit as usize);
    let window = line_window(&String::from_utf8_lossy(&bytes), offset, limit);
    let mut capped = CappedText::new(OutputLimits {
        max_lines: usize::MAX,
        max_bytes: mcp.config.output_limits.max_bytes * 4,
    });
    capped.push(window.as_bytes());
    answer(&FileContent {
        sandbox_id: args.sandbox_id,
        path: args.path,
        content: capped.finish(),
    })
}

pub(crate) async fn write_file(
    mcp: &Components,
    call: &CallContext,
    args: WriteFileArgs,
) -> ToolResult {
    let mut live = use_sandbox(mcp, call, &args.sandbox_id)?;
    let content = args.content.into_bytes();
    match live.envd.write_file(&args.path, content.clone()).await {
        Err(error) if sandbox_not_running(&error) => {
            revive(mcp, call, &mut live, error).await?;
            live.envd.write_file(&args.path, content).await?
        }
        written => written?,
    };
    answer(&FileWritten {
        sandbox_id: args.sandbox_id,
        path: args.path,
        success: true,
    })
}

pub(crate) async fn manage_sandbox(
    mcp: &Components,
    call: &CallContext,
    args: ManageSandboxArgs,
) -> ToolResult {
    let sandbox_id = args.sandbox_id.as_str();
    let action = ManageAction::parse(&args.action)?;
    let mut state = tracked(mcp, call, sandbox_id)?;
    let connected = require_connection(mcp, call)?;
    let sessions = &mcp.sessions;
    match action {
        ManageAction::Pause => {
            connected.api.pause_sandbox(sandbox_id).await?;
            sessions.set_status(&call.identity, sandbox_id, SandboxStatus::Paused)?;
        }
        ManageAction::Resume => {
            if let Some(timeout) = args.timeout_seconds {
                state.timeout_seconds = timeout;
            }
            resume(mcp, call, &connected, &mut state).await?;
        }
        ManageAction::Delete => {
            let killed = connected.api.kill_sandbox(sandbox_id).await;
            if killed.is_ok() || matches!(&killed, Err(error) if error.status() == Some(404)) {
                sessions.set_status(&call.identity, sandbox_id, SandboxStatus::Deleted)?;
            }
            killed?;
        }
    }
    answer(&Managed {
        sandbox_id: args.sandbox_id,
        action: args.action,
        success: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_result_has_the_documented_fields() {
        let result = answer(&ExecResult {
            sandbox_id: "i1".into(),
            cwd: "/home/user".into(),
            stdout: "hi\n".into(),
            stderr: String::new(),
            exit_code: 0,
            success: true,
            truncated: false,
            total_lines: 1,
            error: None,
        })
        .unwrap();
        let keys: Vec<&str> = result
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "cwd",
                "exit_code",
                "sandbox_id",
                "stderr",
                "stdout",
                "success",
                "total_lines",
                "truncated"
            ]
        );
    }

    #[test]
    fn session_list_entries_keep_a_null_title() {
        let listed = answer(&SandboxList {
            count: 1,
            sandboxes: vec![SessionSandbox {
                sandbox_id: "i1".into(),
                title: None,
                template: "base".into(),
                status: "running".into(),
                created_at_unix: 7,
            }],
            next_token: None,
        })
        .unwrap();
        assert_eq!(
            listed,
            serde_json::json!({"count": 1, "sandboxes": [{"sandbox_id": "i1", "title": null,
                "template": "base", "status": "running", "created_at_unix": 7}]})
        );
    }

    #[test]
    fn manage_actions_are_named_on_refusal() {
        assert_eq!(ManageAction::parse("resume").unwrap(), ManageAction::Resume);
        assert!(matches!(
            ManageAction::parse("stop"),
            Err(ToolFailure::Message(message)) if message.contains("not \"stop\"")
        ));
    }

    #[test]
    fn create_arguments_take_both_documents() {
        let args: CreateSandboxArgs = serde_json::from_value(serde_json::json!({
            "title": "t", "template": "base", "timeout_seconds": 60,
            "env_vars": {"A": "1"}, "upload_files": [{"session_path": "a", "sandbox_path": "/b"}],
            "auto_resume": true
        }))
        .unwrap();
        assert_eq!(args.timeout_seconds, Some(60));
        assert_eq!(args.env_vars.unwrap()["A"], "1");
        assert_eq!(args.upload_files.unwrap()[0].sandbox_path, "/b");
    }
}
